// What every fuzzer shares: the input written to a file (the readers under
// test read files), and the rule that the only acceptable failure is
// meshtrain's own error (meshtrain::Error: MT_CHECK's InvalidArgument and the
// like); any other exception escapes and the fuzzer reports it as a crash, as
// would a signal, a sanitizer report or a hang. That includes
// meshtrain::InternalError, MT_ASSERT's broken invariant, which is no
// meshtrain::Error: an input that trips one has found a bug
// (planted_assert_fuzzer.cpp proves the harness lets it through).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace meshtrain::fuzz {

// A folder of this process's own under the system's temporary folder.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("meshtrain-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Write bytes to scratch_dir()/name and return its path.
inline std::string write_input(const std::string& name, std::string_view bytes) {
  const auto path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) __builtin_trap();  // the scratch folder itself failed: not the reader's fault
  return path.string();
}

// Runs body; a meshtrain::Error is the clear error a bad input deserves.
// Everything else, meshtrain::InternalError included, escapes: a crash.
template <typename Body>
void expect_result_or_clear_error(Body&& body) {
  try {
    body();
  } catch (const meshtrain::Error&) {
  }
}

// An input property that must hold: a failure is a crash the fuzzer keeps.
inline void require(bool property) {
  if (!property) __builtin_trap();
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace meshtrain::fuzz
