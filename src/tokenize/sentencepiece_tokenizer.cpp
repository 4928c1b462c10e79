#include "tokenize/sentencepiece_tokenizer.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include "core/error.h"

namespace meshtrain::tokenize {

namespace {

// Encoding is const on the processor: one processor serves every thread.
class SentencePieceEncoder : public Encoder {
 public:
  explicit SentencePieceEncoder(const sentencepiece::SentencePieceProcessor& p) : processor_(p) {}
  void encode(std::string_view text, std::vector<uint32_t>& ids) override {
    ids_.clear();
    const auto status = processor_.Encode(text, &ids_);
    MT_CHECK(status.ok(), "SentencePiece could not encode a text of {} bytes: {}", text.size(), status.ToString());
    ids.insert(ids.end(), ids_.begin(), ids_.end());
  }

 private:
  const sentencepiece::SentencePieceProcessor& processor_;
  std::vector<int> ids_;
};

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(path) {
  const auto status = processor_->Load(path);
  MT_CHECK(status.ok(), "tokenizer {} is not a SentencePiece model: {}", path, status.ToString());
  MT_CHECK(processor_->GetPieceSize() > 0, "tokenizer {}: the SentencePiece model has no pieces", path);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<Encoder> SentencePieceTokenizer::encoder() const {
  return std::make_unique<SentencePieceEncoder>(*processor_);
}

uint32_t SentencePieceTokenizer::max_token_id() const { return static_cast<uint32_t>(processor_->GetPieceSize() - 1); }

std::optional<uint32_t> SentencePieceTokenizer::token_id(std::string_view name) const {
  const int id = processor_->PieceToId(name);
  // PieceToId gives the unknown token's id for a piece it does not have.
  if (id < 0 || (id == processor_->unk_id() && name != processor_->IdToPiece(id))) return std::nullopt;
  return static_cast<uint32_t>(id);
}

std::optional<std::string> SentencePieceTokenizer::default_end_of_text() const {
  if (processor_->eos_id() < 0) return std::nullopt;
  return processor_->IdToPiece(processor_->eos_id());
}

std::string SentencePieceTokenizer::describe() const {
  return fmt::format("SentencePiece model {}: {} pieces", path_, processor_->GetPieceSize());
}

}  // namespace meshtrain::tokenize
