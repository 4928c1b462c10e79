// A SentencePiece model (Llama 2, Mistral: tokenizer.model) through
// Debian's libsentencepiece: ids equal the Python package's
// SentencePieceProcessor.encode(text) (no BOS or EOS added).
#pragma once

#include <memory>
#include <string>

#include "tokenize/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace meshtrain::tokenize {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads the model; throws naming `path` when it is not one.
  explicit SentencePieceTokenizer(const std::string& path);
  ~SentencePieceTokenizer() override;
  std::unique_ptr<Encoder> encoder() const override;
  uint32_t max_token_id() const override;
  std::optional<uint32_t> token_id(std::string_view name) const override;
  std::optional<std::string> default_end_of_text() const override;
  std::string describe() const override;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::string path_;
};

}  // namespace meshtrain::tokenize
