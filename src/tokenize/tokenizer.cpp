#include "tokenize/tokenizer.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenize/bpe_tokenizer.h"
#include "tokenize/sentencepiece_tokenizer.h"

namespace meshtrain::tokenize {

namespace {

// The first line of the file (at most 4 KiB of it).
std::string first_line(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return head.substr(0, head.find('\n'));
}

std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, const std::string& config_path,
                                         bool encode_specials) {
  RankTable ranks = read_tiktoken_ranks(path);
  BpeSettings settings = read_bpe_settings(config_path, static_cast<uint32_t>(ranks.size()));
  settings.encode_specials = encode_specials;
  return std::make_unique<BpeTokenizer>(std::move(ranks), std::move(settings), path);
}

// The model; when it is none, the error says why the file was not read as a
// tiktoken file either (`not_tiktoken`: what is wrong with its first line).
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, const std::optional<std::string>& not_tiktoken) {
  try {
    return std::make_unique<SentencePieceTokenizer>(path);
  } catch (const InvalidArgument& e) {
    if (!not_tiktoken) throw;
    throw InvalidArgument(fmt::format(
        "{}; nor is it a tiktoken BPE file of 'base64-token rank' lines (line 1: {}): is it a tokenizer file?",
        e.what(), *not_tiktoken));
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, TokenizerKind kind, const std::string& config_path,
                                          bool encode_specials) {
  MT_CHECK(std::filesystem::is_regular_file(path), "tokenizer file {} {}", path,
           std::filesystem::exists(path) ? "is not a file" : "does not exist");
  std::optional<std::string> not_tiktoken;
  if (kind == TokenizerKind::automatic) {
    std::string line = first_line(path);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    not_tiktoken = tiktoken_line_error(line);
    kind = not_tiktoken ? TokenizerKind::sentencepiece : TokenizerKind::tiktoken;
  }
  if (kind == TokenizerKind::tiktoken) return load_tiktoken(path, config_path, encode_specials);
  auto model = load_sentencepiece(path, not_tiktoken);
  MT_CHECK(config_path.empty(), "--tokenizer-config is for tiktoken BPE files; {} is a SentencePiece model", path);
  MT_CHECK(!encode_specials, "--encode-specials is for tiktoken BPE files; {} is a SentencePiece model", path);
  return model;
}

}  // namespace meshtrain::tokenize
