#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenize/split_pattern.h"

#include <pcre2.h>

#include "core/error.h"

namespace meshtrain::tokenize {

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// Unicode's White_Space, and its complement (without the surrogates), as class ranges.
constexpr std::string_view kSpaceRanges =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr std::string_view kNonSpaceRanges =
    R"(\x00-\x08\x0E-\x1F!-\x{84}\x{86}-\x{9F}\x{A1}-\x{167F}\x{1681}-\x{1FFF}\x{200B}-\x{2027}\x{202A}-\x{202E})"
    R"(\x{2030}-\x{205E}\x{2060}-\x{2FFF}\x{3001}-\x{D7FF}\x{E000}-\x{10FFFF})";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

pcre2_code* code_of(void* code) { return static_cast<pcre2_code*>(code); }

}  // namespace

std::string translate_whitespace_classes(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's' || e == 'S') {
        const std::string_view ranges = e == 's' ? kSpaceRanges : kNonSpaceRanges;
        out += in_class ? std::string(ranges) : "[" + std::string(ranges) + "]";
      } else if (e == 'Q') {  // \Q...\E: literal to the \E
        const size_t end = pattern.find("\\E", i + 1);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i - 1, stop - (i - 1)));
        i = stop - 1;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:]
      const size_t end = pattern.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

SplitPattern::SplitPattern(const std::string& pattern) : pattern_(pattern) {
  const std::string translated = translate_whitespace_classes(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NEVER_BACKSLASH_C, &error, &offset, nullptr);
  MT_CHECK(code != nullptr,
           "the split pattern {:?} is not a regular expression PCRE2 compiles: {} (at offset {} of {:?})", pattern,
           pcre2_message(error), offset, translated);
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  // without JIT (no JIT on this CPU): interpreted
}

SplitPattern::~SplitPattern() { pcre2_code_free(code_of(code_)); }

struct SplitPattern::Matcher::State {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~State() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

SplitPattern::Matcher::Matcher(const SplitPattern& pattern) : state_(std::make_unique<State>()), pattern_(pattern) {
  state_->data = pcre2_match_data_create_from_pattern(code_of(pattern.code_), nullptr);
  state_->context = pcre2_match_context_create(nullptr);
  MT_CHECK(state_->data && state_->context, "out of memory for the split pattern's match data");
  if (pattern.jit_) {
    state_->stack = pcre2_jit_stack_create(32 << 10, 64 << 20, nullptr);
    MT_CHECK(state_->stack, "out of memory for the split pattern's JIT stack");
    pcre2_jit_stack_assign(state_->context, nullptr, state_->stack);
  }
}

SplitPattern::Matcher::~Matcher() = default;

void SplitPattern::Matcher::split(std::string_view text, const std::function<void(std::string_view)>& each) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  pcre2_code* code = code_of(pattern_.code_);
  size_t at = 0;
  while (at < text.size()) {
    const int rc = pattern_.jit_
                       ? pcre2_jit_match(code, subject, text.size(), at, 0, state_->data, state_->context)
                       : pcre2_match(code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, state_->data, state_->context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    MT_CHECK(rc >= 0, "the split pattern failed on the text at byte {}: {}", at, pcre2_message(rc));
    const PCRE2_SIZE* match = pcre2_get_ovector_pointer(state_->data);
    if (match[1] > match[0]) {
      each(text.substr(match[0], match[1] - match[0]));
      at = match[1];
      continue;
    }
    // An empty match: on past the character there (UTF-8 continuation bytes are 10xxxxxx).
    at = match[0] + 1;
    while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
  }
}

}  // namespace meshtrain::tokenize
