#include "tokenize/utf8.h"

#include <cstdint>

namespace meshtrain::tokenize {

namespace {

// The bytes of the well-formed sequence at text[at], or of the maximal
// subpart of an ill-formed one as a negative count (at least 1 byte).
int sequence_at(std::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(at);
  if (lead < 0x80) return 1;
  int length = 0;
  uint8_t low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  if (lead >= 0xE0 && lead <= 0xEF) length = 3;
  if (lead >= 0xF0 && lead <= 0xF4) length = 4;
  if (length == 0) return -1;
  if (lead == 0xE0) low = 0xA0;
  if (lead == 0xED) high = 0x9F;
  if (lead == 0xF0) low = 0x90;
  if (lead == 0xF4) high = 0x8F;
  for (int k = 1; k < length; ++k) {
    if (at + k >= text.size()) return -k;
    const uint8_t b = byte(at + k);
    const bool ok = k == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -k;
  }
  return length;
}

}  // namespace

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  size_t at = 0;
  while (at < text.size()) {
    // ASCII eight bytes at a time: most text is.
    while (at + 8 <= text.size()) {
      uint64_t word;
      __builtin_memcpy(&word, text.data() + at, 8);
      if (word & 0x8080808080808080ull) break;
      at += 8;
    }
    if (at >= text.size()) break;
    const int n = sequence_at(text, at);
    if (n < 0) return at;
    at += static_cast<size_t>(n);
  }
  return std::nullopt;
}

std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  while (at < text.size()) {
    const int n = sequence_at(text, at);
    if (n > 0) {
      out.append(text.substr(at, static_cast<size_t>(n)));
      at += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");
      at += static_cast<size_t>(-n);
    }
  }
  return out;
}

}  // namespace meshtrain::tokenize
