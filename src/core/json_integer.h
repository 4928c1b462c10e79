// Integers read from JSON that a user or another process wrote: checked to be
// integers in range before they are converted (nlohmann's get<int>() casts a
// float such as 1e30 with undefined behaviour, and wraps a large integer);
// and the JSON library's messages without its internal tags. Templates over
// the JSON type, so core does not depend on a JSON library.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace meshtrain {

// A value as an integer in [lowest, highest]; `what` names it in the error.
template <typename Json>
int64_t json_integer_value(const Json& v, std::string_view what, int64_t lowest, int64_t highest) {
  bool in_range = false;
  int64_t value = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.template get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(highest) && static_cast<int64_t>(u) >= lowest;
    value = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.template get<int64_t>();
    in_range = value >= lowest && value <= highest;
  }
  MT_CHECK(in_range, "{} must be an integer from {} to {}, got {}", what, lowest, highest, v.dump());
  return value;
}

// j[key] as an integer in [lowest, highest]; throws InvalidArgument naming
// the key and what it holds otherwise (a missing key too).
template <typename Json>
int64_t json_integer(const Json& j, std::string_view key, int64_t lowest, int64_t highest) {
  MT_CHECK(j.is_object(), "expected an object with key '{}', got {}", key, j.type_name());
  const auto it = j.find(key);
  MT_CHECK(it != j.end(), "key '{}' is missing (an integer from {} to {})", key, lowest, highest);
  return json_integer_value(*it, key, lowest, highest);
}

// j[key] as an array of integers, each in [lowest, highest].
template <typename Json>
std::vector<int64_t> json_integer_list(const Json& j, std::string_view key, int64_t lowest, int64_t highest) {
  MT_CHECK(j.is_object() && j.contains(key) && j[std::string(key)].is_array(), "key '{}' must be an array of integers",
           key);
  std::vector<int64_t> out;
  for (const auto& v : j[std::string(key)])
    out.push_back(json_integer_value(v, fmt::format("'{}' element", key), lowest, highest));
  return out;
}

// An exception's message without the JSON library's "[json.exception.type_error.302] " tag.
inline std::string json_error_text(const std::exception& e) {
  std::string_view what = e.what();
  if (what.starts_with("[json.exception.")) {
    const size_t end = what.find("] ");
    if (end != std::string_view::npos) what.remove_prefix(end + 2);
  }
  return std::string(what);
}

}  // namespace meshtrain
