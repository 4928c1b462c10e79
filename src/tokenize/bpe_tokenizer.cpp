#include "tokenize/bpe_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <variant>

#include "core/error.h"
#include "core/file_io.h"
#include "tokenize/bpe_merge.h"

namespace meshtrain::tokenize {

namespace {

constexpr size_t kMaxTokenizerBytes = size_t{1} << 30;
constexpr size_t kCachedUpTo = 256;            // longer pieces are merged each time
constexpr size_t kCacheIds = size_t{1} << 22;  // ids held before the cache starts over

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with its padding; nullopt when `text` is not.
std::optional<std::string> base64_decode(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  size_t pad = 0;
  while (pad < 2 && text[text.size() - 1 - pad] == '=') ++pad;
  std::string out;
  uint32_t bits = 0;
  int held = 0;
  for (size_t i = 0; i < text.size() - pad; ++i) {
    const int v = base64_value(text[i]);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out += static_cast<char>((bits >> held) & 0xFF);
    }
  }
  return out;
}

std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t at = 0;
  while (at < line.size()) {
    while (at < line.size() && std::isspace(static_cast<unsigned char>(line[at]))) ++at;
    const size_t start = at;
    while (at < line.size() && !std::isspace(static_cast<unsigned char>(line[at]))) ++at;
    if (at > start) fields.push_back(line.substr(start, at - start));
  }
  return fields;
}

// The (token, rank) of one line of a tiktoken file, or a message saying what is wrong with it.
std::variant<std::pair<std::string, uint32_t>, std::string> parse_rank_line(std::string_view line) {
  const std::vector<std::string_view> fields = fields_of(line);
  if (fields.size() != 2) return fmt::format("{} fields where there should be 2 (base64 token, rank)", fields.size());
  std::optional<std::string> token = base64_decode(fields[0]);
  if (!token) return fmt::format("{:?} is not base64", fields[0].substr(0, 60));
  uint32_t rank = 0;
  const auto [end, error] = std::from_chars(fields[1].data(), fields[1].data() + fields[1].size(), rank);
  if (error != std::errc() || end != fields[1].data() + fields[1].size() || rank == kNoRank)
    return fmt::format("rank {:?} is not an integer in 0..{}", fields[1].substr(0, 30), kNoRank - 1);
  return std::pair{std::move(*token), rank};
}

void check_distinct_ranks(const std::string& path, std::vector<uint32_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  const auto twice = std::adjacent_find(ranks.begin(), ranks.end());
  MT_CHECK(twice == ranks.end(), "tokenizer {}: rank {} is given to two tokens (tiktoken refuses such a file)", path,
           *twice);
}

}  // namespace

std::optional<std::string> tiktoken_line_error(std::string_view line) {
  auto parsed = parse_rank_line(line);
  if (std::holds_alternative<std::pair<std::string, uint32_t>>(parsed)) return std::nullopt;
  return std::get<std::string>(parsed);
}

RankTable read_tiktoken_ranks(const std::string& path) {
  const std::string text = read_small_file(path, kMaxTokenizerBytes, "tokenizer file");
  RankTable table;
  std::vector<uint32_t> ranks;
  size_t at = 0, line_number = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = std::string_view(text).substr(at, end - at);
    at = end + 1;
    ++line_number;
    if (fields_of(line).empty()) continue;
    auto parsed = parse_rank_line(line);
    const bool ok = std::holds_alternative<std::pair<std::string, uint32_t>>(parsed);
    MT_CHECK(ok,
             "tokenizer {} line {}: {}; a tiktoken BPE file holds one 'base64-token rank' per line (is it a "
             "tokenizer file? give --tokenizer-type sentencepiece for a SentencePiece model)",
             path, line_number, std::get<std::string>(parsed));
    auto& [token, rank] = std::get<std::pair<std::string, uint32_t>>(parsed);
    MT_CHECK(table.insert(token, rank), "tokenizer {} line {}: token {:?} is given a rank twice", path, line_number,
             token);
    ranks.push_back(rank);
  }
  MT_CHECK(table.size() > 0, "tokenizer {} holds no tokens (an empty tiktoken BPE file)", path);
  check_distinct_ranks(path, std::move(ranks));
  return table;
}

std::vector<std::pair<std::string, uint32_t>> llama3_special_tokens(uint32_t first) {
  std::vector<std::string> names{"<|begin_of_text|>",
                                 "<|end_of_text|>",
                                 "<|reserved_special_token_0|>",
                                 "<|reserved_special_token_1|>",
                                 "<|finetune_right_pad_id|>",
                                 "<|reserved_special_token_2|>",
                                 "<|start_header_id|>",
                                 "<|end_header_id|>",
                                 "<|eom_id|>",
                                 "<|eot_id|>",
                                 "<|python_tag|>"};
  for (int i = 3; names.size() < 256; ++i) names.push_back(fmt::format("<|reserved_special_token_{}|>", i));
  std::vector<std::pair<std::string, uint32_t>> specials;
  for (size_t i = 0; i < names.size(); ++i) specials.emplace_back(names[i], first + static_cast<uint32_t>(i));
  return specials;
}

BpeSettings read_bpe_settings(const std::string& config_path, uint32_t num_ranks) {
  BpeSettings settings;
  settings.special_tokens = llama3_special_tokens(num_ranks);
  if (config_path.empty()) return settings;
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_small_file(config_path, 64 << 20, "tokenizer config"));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("tokenizer config {} is not JSON: {}", config_path, e.what()));
  }
  MT_CHECK(config.is_object(), "tokenizer config {}: expected a JSON object with \"pattern\" and \"special_tokens\"",
           config_path);
  for (const auto& [key, value] : config.items()) {
    MT_CHECK(key == "pattern" || key == "special_tokens",
             "tokenizer config {}: unknown key {:?} (the keys: \"pattern\", \"special_tokens\")", config_path, key);
    if (key == "pattern") {
      MT_CHECK(value.is_string(), "tokenizer config {}: \"pattern\" must be a string", config_path);
      settings.pattern = value.get<std::string>();
    }
  }
  if (!config.contains("special_tokens")) return settings;
  const nlohmann::json& specials = config["special_tokens"];
  MT_CHECK(specials.is_object(), "tokenizer config {}: \"special_tokens\" must be an object of token text to id",
           config_path);
  settings.special_tokens.clear();
  for (const auto& [text, id] : specials.items()) {
    MT_CHECK(id.is_number_unsigned() && id.get<uint64_t>() < kNoRank,
             "tokenizer config {}: special token {:?} has id {}; an id is an integer in 0..{}", config_path, text,
             id.dump(), kNoRank - 1);
    settings.special_tokens.emplace_back(text, id.get<uint32_t>());
  }
  return settings;
}

namespace {

// Transparent hashing, so that the cache is looked up by string_view.
struct PieceHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return RankTable::hash(s); }
};

class BpeEncoder : public Encoder {
 public:
  explicit BpeEncoder(const BpeTokenizer& t) : t_(t), matcher_(t.pattern()) {
    for (const auto& [text, id] : t.settings().special_tokens) first_bytes_[static_cast<unsigned char>(text[0])] = 1;
  }

  void encode(std::string_view text, std::vector<uint32_t>& ids) override {
    if (!t_.settings().encode_specials) return encode_ordinary(text, ids);
    size_t at = 0;
    while (at < text.size()) {
      const auto [where, special] = next_special(text, at);
      encode_ordinary(text.substr(at, where - at), ids);
      if (special == nullptr) break;
      ids.push_back(special->second);
      at = where + special->first.size();
    }
  }

 private:
  void encode_ordinary(std::string_view text, std::vector<uint32_t>& ids) {
    matcher_.split(text, [&](std::string_view piece) { encode_piece(piece, ids); });
  }

  void encode_piece(std::string_view piece, std::vector<uint32_t>& ids) {
    const RankTable& ranks = t_.ranks();
    if (const uint32_t rank = ranks.find(piece); rank != kNoRank) return ids.push_back(rank);
    if (piece.size() > kCachedUpTo) return bpe_merge(ranks, piece, ids);
    if (const auto hit = cache_.find(piece); hit != cache_.end()) {
      ids.insert(ids.end(), cached_.begin() + hit->second.first,
                 cached_.begin() + hit->second.first + hit->second.second);
      return;
    }
    const size_t before = ids.size();
    bpe_merge(ranks, piece, ids);
    if (cached_.size() > kCacheIds) cache_.clear(), cached_.clear();
    cache_.emplace(std::string(piece), std::pair<uint32_t, uint32_t>(cached_.size(), ids.size() - before));
    cached_.insert(cached_.end(), ids.begin() + static_cast<std::ptrdiff_t>(before), ids.end());
  }

  // The leftmost special token in `text` from `from` (the longest of those that start there), or (size, null).
  std::pair<size_t, const std::pair<std::string, uint32_t>*> next_special(std::string_view text, size_t from) const {
    for (size_t at = from; at < text.size(); ++at) {
      if (!first_bytes_[static_cast<unsigned char>(text[at])]) continue;
      const std::pair<std::string, uint32_t>* best = nullptr;
      for (const auto& special : t_.settings().special_tokens)
        if (text.substr(at).starts_with(special.first) && (!best || special.first.size() > best->first.size()))
          best = &special;
      if (best) return {at, best};
    }
    return {text.size(), nullptr};
  }

  const BpeTokenizer& t_;
  SplitPattern::Matcher matcher_;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, PieceHash, std::equal_to<>> cache_;
  std::vector<uint32_t> cached_;  // the cache's ids: an entry is (offset, count) here
  bool first_bytes_[256] = {};
};

}  // namespace

BpeTokenizer::BpeTokenizer(RankTable ranks, BpeSettings settings, std::string source)
    : ranks_(std::move(ranks)),
      settings_(std::move(settings)),
      pattern_(settings_.pattern),
      source_(std::move(source)) {
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    MT_CHECK(ranks_.find(std::string_view(&byte, 1)) != kNoRank,
             "tokenizer {}: byte 0x{:02X} has no token of its own: not a byte-level BPE vocabulary (tiktoken's "
             "files and Llama 3's give each of the 256 bytes a rank)",
             source_, b);
  }
  std::vector<uint32_t> ids;
  for (const auto& [bytes, rank] : ranks_.entries()) ids.push_back(rank);
  std::sort(ids.begin(), ids.end());
  max_id_ = ids.back();
  for (const auto& [text, id] : settings_.special_tokens) {
    MT_CHECK(!text.empty(), "tokenizer {}: a special token's text is empty", source_);
    MT_CHECK(!std::binary_search(ids.begin(), ids.end(), id),
             "tokenizer {}: special token {:?} has id {}, which is the rank of an ordinary token", source_, text, id);
    max_id_ = std::max(max_id_, id);
  }
  std::vector<std::pair<std::string, uint32_t>> sorted = settings_.special_tokens;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  for (size_t i = 1; i < sorted.size(); ++i)
    MT_CHECK(sorted[i].second != sorted[i - 1].second, "tokenizer {}: special tokens {:?} and {:?} share id {}",
             source_, sorted[i - 1].first, sorted[i].first, sorted[i].second);
}

std::unique_ptr<Encoder> BpeTokenizer::encoder() const { return std::make_unique<BpeEncoder>(*this); }

std::optional<uint32_t> BpeTokenizer::token_id(std::string_view name) const {
  for (const auto& [text, id] : settings_.special_tokens)
    if (text == name) return id;
  return std::nullopt;
}

std::optional<std::string> BpeTokenizer::default_end_of_text() const {
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>"})
    if (token_id(name)) return name;
  return std::nullopt;
}

size_t BpeTokenizer::cut_point(std::string_view text, size_t from) const {
  if (settings_.encode_specials || settings_.pattern != kLlama3Pattern) return std::string_view::npos;
  for (size_t at = from; at < text.size(); ++at) {
    at = text.find('\n', at);
    if (at == std::string_view::npos || at + 1 >= text.size()) break;
    const char c = static_cast<char>(text[at + 1] | 0x20);  // lower case, for a letter
    if (c >= 'a' && c <= 'z') return at + 1;
  }
  return std::string_view::npos;
}

std::string BpeTokenizer::describe() const {
  return fmt::format("tiktoken BPE {}: {} ranks, {} special tokens, {} split pattern", source_, ranks_.size(),
                     settings_.special_tokens.size(), settings_.pattern == kLlama3Pattern ? "the Llama 3" : "a custom");
}

}  // namespace meshtrain::tokenize
