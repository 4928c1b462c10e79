// FNV-1a (64-bit) of bytes: finds a flipped or lost byte, or two ranks'
// differing inputs, not an attacker. Fed in pieces, the same as over the whole.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshtrain {

struct Fnv1a {
  uint64_t hash = 14695981039346656037ull;
  void add(std::string_view bytes) {
    uint64_t h = hash;
    for (const char c : bytes) {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ull;
    }
    hash = h;
  }
};

inline uint64_t fnv1a(std::string_view bytes) {
  Fnv1a sum;
  sum.add(bytes);
  return sum.hash;
}

}  // namespace meshtrain
