// libFuzzer target: a checkpoint folder (checkpoint::read_checkpoint_info, then
// checkpoint::load_checkpoint_whole): its metadata.json and up to two rank files.
// Input: a flags byte, then sections each prefixed by a 4-byte little-endian
// length: metadata.json, rank_00000.safetensors, rank_00001.safetensors.
// With flag bit 0 the metadata's file sizes and checksums, and its own
// checksum, are made to match, so the input reaches the metadata's
// semantics, the shard reader and the resharding copy.
// A checkpoint that loads must give every tensor the shape and dtype its
// metadata says; anything else must be a clear error.
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/hash.h"
#include "fuzz/fuzz_input.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::vector<std::string> sections;
  size_t at = 1;
  while (sections.size() < 3 && at + 4 <= size) {
    uint32_t n = 0;
    std::memcpy(&n, data + at, 4);
    at += 4;
    n = static_cast<uint32_t>(std::min<size_t>(n, size - at));
    sections.emplace_back(reinterpret_cast<const char*>(data + at), n);
    at += n;
  }
  if (sections.empty()) return 0;
  const auto dir = fuzz::scratch_dir() / "checkpoint" / "step_000001";
  std::filesystem::remove_all(dir.parent_path());
  std::filesystem::create_directories(dir);
  std::string metadata = sections[0];
  if ((flags & 1) != 0) {
    try {
      auto m = nlohmann::ordered_json::parse(metadata);
      for (size_t r = 1; r < sections.size(); ++r) {
        m.at("files").at(r - 1)["bytes"] = sections[r].size();
        m.at("files").at(r - 1)["fnv1a64"] = fmt::format("{:016x}", fnv1a(sections[r]));
      }
      m.erase("metadata_fnv1a64");
      m["metadata_fnv1a64"] = fmt::format("{:016x}", fnv1a(m.dump()));
      metadata = m.dump();
    } catch (const nlohmann::json::exception&) {
    }
  }
  fuzz::write_input("checkpoint/step_000001/metadata.json", metadata);
  for (size_t r = 1; r < sections.size(); ++r)
    fuzz::write_input(fmt::format("checkpoint/step_000001/rank_{:05d}.safetensors", r - 1), sections[r]);
  fuzz::expect_result_or_clear_error([&] {
    const checkpoint::CheckpointInfo info = checkpoint::read_checkpoint_info(dir.string());
    fuzz::require(checkpoint::latest_checkpoint(dir.parent_path().string()) == dir.string());
    for (const auto& [name, t] : checkpoint::load_checkpoint_whole(info)) {
      const auto& described = info.metadata.at("tensors").at(name);
      fuzz::require(t.shape().dims() == described.at("shape").get<std::vector<int64_t>>());
      fuzz::require(t.dtype() == parse_dtype(described.at("dtype").get<std::string>()));
    }
  });
  return 0;
}
