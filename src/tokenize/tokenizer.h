// What `meshtrain tokenize` needs of a tokenizer, whichever kind: a
// per-thread encoder of text to ids, the largest id, and token ids by name.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::tokenize {

// One thread's encoder (its own scratch state and cache).
class Encoder {
 public:
  virtual ~Encoder() = default;
  // Appends the ids of `text`, which is valid UTF-8, to `ids`.
  virtual void encode(std::string_view text, std::vector<uint32_t>& ids) = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::unique_ptr<Encoder> encoder() const = 0;
  // The largest id it can give: shards hold uint16 ids when it is under 65536.
  virtual uint32_t max_token_id() const = 0;
  // The id of a special token (tiktoken) or piece (SentencePiece) by its text.
  virtual std::optional<uint32_t> token_id(std::string_view name) const = 0;
  // The token that ends a document by default ("<|end_of_text|>", "</s>"...), if it has one.
  virtual std::optional<std::string> default_end_of_text() const = 0;
  // The first offset at or after `from` where `text` can be cut in two that
  // tokenize apart to the ids of the whole (so one long document is shared
  // out between threads), or npos: none (the default).
  virtual size_t cut_point(std::string_view text, size_t from) const { return std::string_view::npos; }
  // One line: its kind, file and size ("tiktoken BPE tokenizer.model: 128000 ranks, 256 special tokens").
  virtual std::string describe() const = 0;
};

enum class TokenizerKind { automatic, tiktoken, sentencepiece };

// The tokenizer in `path`: a tiktoken ranks file (with `config_path`, a JSON
// sidecar of pattern and special tokens, when not empty) or a SentencePiece
// model; `automatic` tells them apart by content. `encode_specials`: special
// tokens written in the text become their ids (tiktoken only). Throws saying
// what `path` is not.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, TokenizerKind kind, const std::string& config_path,
                                          bool encode_specials);

}  // namespace meshtrain::tokenize
