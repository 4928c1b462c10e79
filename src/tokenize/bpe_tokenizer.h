// A tiktoken-format byte-level BPE (Llama 3's tokenizer.model, OpenAI's
// .tiktoken files): "base64-token rank" per line, a split pattern and special
// tokens. Ids equal tiktoken's Encoding.encode_ordinary (or, with specials
// encoded, encode(allowed_special="all")) on the same text.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tokenize/rank_table.h"
#include "tokenize/split_pattern.h"
#include "tokenize/tokenizer.h"

namespace meshtrain::tokenize {

// Llama 3.1's 256 special tokens, numbered from `first` (the number of ranks).
std::vector<std::pair<std::string, uint32_t>> llama3_special_tokens(uint32_t first);

// The ranks of a tiktoken file; throws naming the line that is not "base64 rank".
RankTable read_tiktoken_ranks(const std::string& path);
// What is wrong with `line` as a line of one, or nullopt: how a tokenizer file of no stated kind is told apart.
std::optional<std::string> tiktoken_line_error(std::string_view line);

struct BpeSettings {
  std::string pattern = kLlama3Pattern;
  std::vector<std::pair<std::string, uint32_t>> special_tokens;  // text, id
  bool encode_specials = false;                                  // special tokens in the text become their ids
};

// The sidecar JSON of a ranks file: {"pattern": "...", "special_tokens":
// {"<|endoftext|>": 100257, ...}}, both optional (defaults: the Llama 3
// pattern and Llama 3.1's special tokens from `num_ranks`).
BpeSettings read_bpe_settings(const std::string& config_path, uint32_t num_ranks);

class BpeTokenizer : public Tokenizer {
 public:
  // Checks that every byte is a token, that ranks and special ids are distinct.
  BpeTokenizer(RankTable ranks, BpeSettings settings, std::string source = "");
  std::unique_ptr<Encoder> encoder() const override;
  uint32_t max_token_id() const override { return max_id_; }
  std::optional<uint32_t> token_id(std::string_view name) const override;
  std::optional<std::string> default_end_of_text() const override;
  std::string describe() const override;
  // With the Llama 3 pattern and no special tokens encoded: after a line
  // feed that a letter A-Z or a-z follows. No match of that pattern spans
  // such a point, nor looks past it (tokenize_test and the parity test check it).
  size_t cut_point(std::string_view text, size_t from) const override;

  const RankTable& ranks() const { return ranks_; }
  const SplitPattern& pattern() const { return pattern_; }
  const BpeSettings& settings() const { return settings_; }

 private:
  RankTable ranks_;
  BpeSettings settings_;
  SplitPattern pattern_;
  std::string source_;
  uint32_t max_id_ = 0;
};

}  // namespace meshtrain::tokenize
