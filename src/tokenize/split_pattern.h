// The pre-tokenizer of a tiktoken-style BPE: a regular expression (PCRE2,
// Unicode properties, JIT-compiled) whose matches, left to right, are the
// pieces that BPE merges within. Text between matches is dropped, as
// tiktoken's find_iter drops it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace meshtrain::tokenize {

// The split pattern of Llama 3 and of OpenAI's cl100k_base (as tiktoken wrote it for both).
extern const char* const kLlama3Pattern;

// `pattern` with \s and \S spelled out as Unicode's White_Space property
// (what Rust's regex, which tiktoken runs, means by them; PCRE2's \s also
// takes U+180E), inside and outside character classes.
std::string translate_whitespace_classes(std::string_view pattern);

class SplitPattern {
 public:
  // Compiles `pattern`; throws naming the offset of an error in it.
  explicit SplitPattern(const std::string& pattern);
  ~SplitPattern();
  SplitPattern(const SplitPattern&) = delete;
  SplitPattern& operator=(const SplitPattern&) = delete;
  const std::string& pattern() const { return pattern_; }

  // One thread's matcher: its own match data and JIT stack.
  class Matcher {
   public:
    explicit Matcher(const SplitPattern& pattern);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    // Calls `each` with every match in `text` (valid UTF-8), in order.
    void split(std::string_view text, const std::function<void(std::string_view)>& each);

   private:
    struct State;
    std::unique_ptr<State> state_;
    const SplitPattern& pattern_;
  };

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
};

}  // namespace meshtrain::tokenize
