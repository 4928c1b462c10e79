// UTF-8 checks for text to be tokenized: where the first invalid byte is,
// and the text with each invalid sequence replaced by U+FFFD exactly as
// Python's bytes.decode("utf-8", errors="replace") does.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace meshtrain::tokenize {

// The offset of the first byte of `text` that starts no well-formed UTF-8
// sequence (an overlong form, a surrogate, a code point past U+10FFFF or a
// sequence cut short), or nullopt when all of it is well-formed.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// `text` with every maximal ill-formed subsequence (Unicode's "maximal
// subpart" rule, which CPython follows) replaced by U+FFFD (EF BF BD).
std::string replace_invalid_utf8(std::string_view text);

}  // namespace meshtrain::tokenize
