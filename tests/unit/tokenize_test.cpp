// The tokenize module: UTF-8 checks as Python decodes, byte-level BPE merging
// by rank on a hand-made vocabulary (both merge algorithms), the Llama 3
// split pattern, special tokens, tokenizer files that are not one, llm.c
// shards read back by train's TokenLoader, and tokenize_corpus end to end:
// the same shards on any thread count, the validation split, and each error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "test_util.h"
#include "tokenize/bpe_merge.h"
#include "tokenize/bpe_tokenizer.h"
#include "tokenize/tokenize_corpus.h"
#include "tokenize/utf8.h"
#include "train/data.h"

using namespace meshtrain;
using namespace meshtrain::tokenize;
using mtest::contains;
using mtest::message_of;

namespace {

// Every byte its own rank (its value), then the merged tokens from 256 up.
RankTable tiny_ranks(const std::vector<std::string>& merged) {
  RankTable ranks;
  for (int b = 0; b < 256; ++b) ranks.insert(std::string(1, static_cast<char>(b)), static_cast<uint32_t>(b));
  for (size_t i = 0; i < merged.size(); ++i) ranks.insert(merged[i], static_cast<uint32_t>(256 + i));
  return ranks;
}

std::vector<uint32_t> merge(const RankTable& ranks, const std::string& piece) {
  std::vector<uint32_t> scan, heap, either;
  bpe_merge_scan(ranks, piece, scan);
  bpe_merge_heap(ranks, piece, heap);
  EXPECT_EQ(scan, heap) << piece;
  bpe_merge(ranks, piece, either);
  EXPECT_EQ(scan, either) << piece;
  return scan;
}

std::vector<std::string> pieces(const std::string& pattern, const std::string& text) {
  SplitPattern compiled(pattern);
  SplitPattern::Matcher matcher(compiled);
  std::vector<std::string> out;
  matcher.split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

BpeTokenizer tiny_tokenizer(bool encode_specials = false) {
  BpeSettings settings;
  settings.special_tokens = {{"<|endoftext|>", 300}, {"<|end|>", 301}};
  settings.encode_specials = encode_specials;
  return BpeTokenizer(tiny_ranks({"ab", "bc", "abc", "aa", " a", " ab", "he", "ll", "hell", "hello", " w", "or", "ld"}),
                      settings, "tiny");
}

std::string json_line(const std::string& text) { return nlohmann::json{{"id", 1}, {"text", text}}.dump() + "\n"; }

std::vector<uint32_t> encode(const Tokenizer& t, const std::string& text) {
  std::vector<uint32_t> ids;
  t.encoder()->encode(text, ids);
  return ids;
}

}  // namespace

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(first_invalid_utf8("plain ascii, long enough to take the 8-byte path"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("abcdefghij\xFFz"), 10u);
  EXPECT_EQ(first_invalid_utf8("a\xC0\xAF"), 1u);         // overlong
  EXPECT_EQ(first_invalid_utf8("ab\xED\xA0\x80"), 2u);    // a surrogate
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ok\xF0\x9F\x98"), 2u);    // cut short
}

TEST(Utf8, ReplacesAsPythonDecodes) {
  // Expected: bytes.decode("utf-8", errors="replace").encode() in CPython 3.11.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("a\xFF"
                                 "b"),
            "a" + r + "b");
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"
                                 "A"),
            r + "A");
  EXPECT_EQ(replace_invalid_utf8("\xF0\x80\x80"), r + r + r);
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), r + r);
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(replace_invalid_utf8("ok\xF0\x9F\x98"), "ok" + r);
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(RankTable, InsertsFindsAndRefusesDuplicates) {
  RankTable t;
  for (int i = 0; i < 5000; ++i) ASSERT_TRUE(t.insert("token" + std::to_string(i), static_cast<uint32_t>(i)));
  EXPECT_FALSE(t.insert("token7", 99));
  EXPECT_EQ(t.find("token4999"), 4999u);
  EXPECT_EQ(t.find("token7"), 7u);
  EXPECT_EQ(t.find("nope"), kNoRank);
  EXPECT_EQ(t.size(), 5000u);
}

TEST(BpeMerge, LowestRankFirstLeftmostOnTies) {
  const RankTable ranks = tiny_ranks({"ab", "bc", "abc", "aa"});
  EXPECT_EQ(merge(ranks, "abc"), (std::vector<uint32_t>{258}));        // ab (256), then abc (258)
  EXPECT_EQ(merge(ranks, "bcab"), (std::vector<uint32_t>{257, 256}));  // ab before bc, disjoint
  EXPECT_EQ(merge(ranks, "aaa"), (std::vector<uint32_t>{259, 'a'}));   // the leftmost aa
  EXPECT_EQ(merge(ranks, "xbcz"), (std::vector<uint32_t>{'x', 257, 'z'}));
  EXPECT_EQ(merge(ranks, "q"), (std::vector<uint32_t>{'q'}));
}

TEST(BpeMerge, HeapAndScanAgreeOnLongPieces) {
  std::mt19937 rng(7);
  std::vector<std::string> merged;
  std::uniform_int_distribution<int> letter('a', 'e'), length(2, 6);
  for (int i = 0; i < 300; ++i) {
    std::string m;
    for (int k = length(rng); k > 0; --k) m += static_cast<char>(letter(rng));
    merged.push_back(m);
  }
  RankTable ranks = tiny_ranks({});
  uint32_t next = 256;
  for (const std::string& m : merged) next += ranks.insert(m, next) ? 1 : 0;
  for (int n : {2, 3, 17, 127, 128, 129, 1000, 5000}) {
    std::string piece;
    for (int i = 0; i < n; ++i) piece += static_cast<char>(letter(rng));
    merge(ranks, piece);
  }
}

TEST(SplitPattern, Llama3PiecesAndWhiteSpace) {
  EXPECT_EQ(pieces(kLlama3Pattern, "Hello world's  DON'T\n\n  1234567 x!!\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " DON", "'T", "\n\n", " ", " ", "123", "456", "7",
                                      " x", "!!\n"}));
  // U+180E is not White_Space (Rust's regex, tiktoken), though PCRE2's \s takes it.
  EXPECT_EQ(pieces(R"(\s+|\S+)",
                   "a\xE1\xA0\x8E"
                   "b c"),
            (std::vector<std::string>{"a\xE1\xA0\x8E"
                                      "b",
                                      " ", "c"}));
  EXPECT_EQ(pieces(R"([^\s]+|[\s]+)", "x\xE1\xA0\x8E\xE3\x80\x80y"),
            (std::vector<std::string>{"x\xE1\xA0\x8E", "\xE3\x80\x80", "y"}));
  EXPECT_TRUE(contains(message_of([] { SplitPattern("(unclosed"); }), "PCRE2"));
}

TEST(BpeTokenizer, EncodesPiecesBySplitThenMerge) {
  const BpeTokenizer t = tiny_tokenizer();
  // "hello" is a token itself; " world" merges " w" then "or", "ld".
  EXPECT_EQ(encode(t, "hello world"), (std::vector<uint32_t>{265, 266, 267, 268}));
  EXPECT_EQ(encode(t, " abc"), (std::vector<uint32_t>{' ', 258}));  // ab (256) before " a" (260)
  EXPECT_EQ(t.max_token_id(), 301u);
  EXPECT_EQ(t.default_end_of_text(), "<|endoftext|>");
}

TEST(BpeTokenizer, SpecialTokensInTextAreTextUnlessEncoded) {
  const std::string text = "ab<|endoftext|>ab<|end|>";
  const std::vector<uint32_t> ordinary = encode(tiny_tokenizer(false), text);
  EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), 300u), 0);
  EXPECT_EQ(encode(tiny_tokenizer(true), text), (std::vector<uint32_t>{256, 300, 256, 301}));
}

TEST(BpeTokenizer, DefaultsAreLlama3) {
  const BpeSettings s = read_bpe_settings("", 128000);
  EXPECT_EQ(s.pattern, kLlama3Pattern);
  ASSERT_EQ(s.special_tokens.size(), 256u);
  EXPECT_EQ(s.special_tokens[1], (std::pair<std::string, uint32_t>{"<|end_of_text|>", 128001}));
  EXPECT_EQ(s.special_tokens[9], (std::pair<std::string, uint32_t>{"<|eot_id|>", 128009}));
  EXPECT_EQ(s.special_tokens[255].second, 128255u);
}

TEST(BpeTokenizer, CutPointsKeepTheIdsOfTheWhole) {
  const BpeTokenizer t = tiny_tokenizer();
  std::string text;
  std::mt19937 rng(3);
  const std::vector<std::string> words{"hello", " world", "\n", "\n\n", "  ", "abc", "!!", "\r\n", "x.", "1234", " \n"};
  for (int i = 0; i < 3000; ++i) text += words[rng() % words.size()];
  const std::vector<uint32_t> whole = encode(t, text);
  std::vector<uint32_t> cut;
  const auto encoder = t.encoder();
  size_t begin = 0, parts = 0;
  for (size_t at; (at = t.cut_point(text, begin + 50)) != std::string::npos; begin = at, ++parts)
    encoder->encode(std::string_view(text).substr(begin, at - begin), cut);
  encoder->encode(std::string_view(text).substr(begin), cut);
  EXPECT_GT(parts, 20u);
  EXPECT_EQ(cut, whole);
}

// Files in a scratch folder, removed with the fixture.
class TokenizeFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("meshtrain_tokenize_{}", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "in");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::filesystem::create_directories(std::filesystem::path(path(name)).parent_path());
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  std::string read(const std::string& name) const {
    std::ifstream in(path(name), std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  CorpusOptions options(const std::string& out, int threads = 1) const {
    CorpusOptions o;
    o.inputs = {path("in")};
    o.out_dir = path(out);
    o.threads = threads;
    o.end_of_text = 300;
    o.shard_tokens = 50;
    return o;
  }
  CorpusSummary run(const Tokenizer& t, const CorpusOptions& o) const {
    return tokenize_corpus(t, o, [](const CorpusProgress&) {});
  }
  // Every token of a split's shards, read by train's TokenLoader (which
  // needs 2 tokens a shard: a last shard of 1 is read here, 16-bit).
  std::vector<int64_t> read_back(const std::vector<std::string>& shards) const {
    std::vector<int64_t> all;
    for (const std::string& shard : shards) {
      if (std::filesystem::file_size(shard) == 1024 + 2) {
        uint16_t id;
        std::ifstream(shard, std::ios::binary).seekg(1024).read(reinterpret_cast<char*>(&id), 2);
        all.push_back(id);
        continue;
      }
      train::TokenLoader loader(shard, 1, 1);
      const int64_t n = loader.num_tokens();
      for (int64_t i = 0; i + 1 < n; ++i) {
        Tensor in = Tensor::empty({1, 1}, DType::i64), out = Tensor::empty({1, 1}, DType::i64);
        loader.set_cursor(i);
        loader.next(in, out);
        if (i == 0) all.push_back(in.data<int64_t>()[0]);
        all.push_back(out.data<int64_t>()[0]);
      }
    }
    return all;
  }
  std::filesystem::path dir_;
};

TEST_F(TokenizeFiles, ShardWriterRoundTripsThroughTokenLoader) {
  for (uint32_t max_id : {300u, 70000u}) {
    const std::string out = path(fmt::format("shards{}", max_id));
    std::filesystem::create_directories(out);
    ShardWriter w(out, "train", 7, max_id);
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 30; ++i) ids.push_back(i * (max_id / 30));
    w.append(std::span(ids).subspan(0, 11));
    w.append(std::span(ids).subspan(11));
    w.finish();
    ASSERT_EQ(w.paths().size(), 5u);  // 7 + 7 + 7 + 7 + 2
    const std::vector<int64_t> back = read_back(w.paths());
    EXPECT_EQ(back, std::vector<int64_t>(ids.begin(), ids.end()));
    const std::string header = read(fmt::format("shards{}/train_000004.bin", max_id)).substr(0, 12);
    const int32_t expect[3] = {max_id > 65535 ? 20240801 : 20240520, max_id > 65535 ? 7 : 1, 2};
    EXPECT_EQ(header, std::string(reinterpret_cast<const char*>(expect), 12));
  }
}

TEST_F(TokenizeFiles, CorpusRoundTripIsTheSameOnAnyThreadCount) {
  const BpeTokenizer t = tiny_tokenizer();
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) {
    docs.push_back(fmt::format("hello world {} abc\n\naab  bc", i));
    write(fmt::format("in/doc{:02d}.txt", i), docs.back());
  }
  std::string lines;
  for (int i = 0; i < 30; ++i) {
    docs.push_back(fmt::format("line {} says \"hello\"\n and\tmore", i));
    lines += json_line(docs.back());
  }
  write("in/z/lines.jsonl", lines + "\n  \n");
  CorpusOptions one = options("out1", 1), four = options("out4", 4);
  one.val_fraction = four.val_fraction = 0.3;
  one.chunk_bytes = four.chunk_bytes = 8;  // cut documents where allowed
  const CorpusSummary a = run(t, one), b = run(t, four);
  EXPECT_EQ(a.train.documents + a.val.documents, 70);
  EXPECT_GT(a.val.documents, 5);
  EXPECT_GT(a.train.documents, 30);
  ASSERT_EQ(a.train.shards.size(), b.train.shards.size());
  for (const auto& name : {"train_000000.bin", "val_000000.bin"})
    EXPECT_EQ(read(std::string("out1/") + name), read(std::string("out4/") + name));
  std::vector<int64_t> train_expected, val_expected;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int64_t>& into = in_validation_split(0, static_cast<int64_t>(d), 0.3) ? val_expected : train_expected;
    into.push_back(300);
    for (uint32_t id : encode(t, docs[d])) into.push_back(id);
  }
  EXPECT_EQ(read_back(a.train.shards), train_expected);
  EXPECT_EQ(read_back(a.val.shards), val_expected);
}

TEST_F(TokenizeFiles, TokenizerFilesThatAreNotOne) {
  const auto load = [&](const std::string& file, TokenizerKind kind = TokenizerKind::automatic) {
    return message_of([&] { load_tokenizer(path(file), kind, "", false); });
  };
  write("text.model", "just some text\nthat is not a tokenizer\n");
  EXPECT_TRUE(contains(load("text.model"), "is not a SentencePiece model")) << load("text.model");
  EXPECT_TRUE(contains(load("text.model", TokenizerKind::tiktoken), "line 1: 3 fields"));
  write("bad64.tiktoken", "YQ== 0\nYg=! 1\n");
  EXPECT_TRUE(contains(load("bad64.tiktoken", TokenizerKind::tiktoken), "line 2: \"Yg=!\" is not base64"));
  write("dup.tiktoken", "YQ== 0\nYg== 0\n");
  EXPECT_TRUE(contains(load("dup.tiktoken"), "rank 0 is given to two tokens"));
  write("bytes.tiktoken", "YQ== 0\nYg== 1\n");
  EXPECT_TRUE(contains(load("bytes.tiktoken"), "byte 0x00 has no token of its own"));
  write("empty.tiktoken", "");
  EXPECT_TRUE(contains(load("empty.tiktoken", TokenizerKind::tiktoken), "holds no tokens"));
  EXPECT_TRUE(contains(load("missing.model"), "does not exist"));
  EXPECT_TRUE(contains(load("text.model", TokenizerKind::sentencepiece), "is not a SentencePiece model"));
}

TEST_F(TokenizeFiles, ReadsATiktokenFileWithItsConfig) {
  std::string ranks;
  const auto b64 = [](const std::string& bytes) {
    static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < bytes.size(); i += 3) {
      const size_t n = std::min<size_t>(3, bytes.size() - i);
      uint32_t v = 0;
      for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0u);
      for (size_t k = 0; k < 4; ++k) out += k <= n ? digits[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
  };
  for (int b = 0; b < 256; ++b) ranks += b64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  ranks += b64("ab") + " 256\r\n\n" + b64("abc") + " 257\n";
  write("t.tiktoken", ranks);
  write("t.json", R"({"pattern": "\\S+|\\s+", "special_tokens": {"<|endoftext|>": 258}})");
  const auto t = load_tokenizer(path("t.tiktoken"), TokenizerKind::automatic, path("t.json"), false);
  EXPECT_EQ(encode(*t, "abc ab"), (std::vector<uint32_t>{257, ' ', 256}));
  EXPECT_EQ(t->max_token_id(), 258u);
  EXPECT_EQ(t->token_id("<|endoftext|>"), 258u);
  write("bad.json", R"({"pattern": "x", "specials": {}})");
  EXPECT_TRUE(contains(
      message_of([&] { load_tokenizer(path("t.tiktoken"), TokenizerKind::automatic, path("bad.json"), false); }),
      "unknown key \"specials\""));
  write("clash.json", R"({"special_tokens": {"<|x|>": 256}})");
  EXPECT_TRUE(contains(
      message_of([&] { load_tokenizer(path("t.tiktoken"), TokenizerKind::automatic, path("clash.json"), false); }),
      "the rank of an ordinary token"));
}

TEST_F(TokenizeFiles, CorpusErrors) {
  const BpeTokenizer t = tiny_tokenizer();
  const auto error_of = [&](const CorpusOptions& o) { return message_of([&] { run(t, o); }); };
  EXPECT_TRUE(contains(error_of(options("out")), "holds no .txt or .jsonl files"));
  write("in/empty.txt", "");
  EXPECT_TRUE(contains(error_of(options("out")), "no text to tokenize"));
  write("in/bad.txt", "good text\nthen \xC3\x28 bad");
  EXPECT_TRUE(contains(error_of(options("out")), "bad.txt: byte 15 of the file is not valid UTF-8 (bytes C3 28 20 62)"))
      << error_of(options("out"));
  CorpusOptions replace = options("out");
  replace.invalid_utf8 = InvalidUtf8::replace;
  EXPECT_EQ(run(t, replace).train.documents, 1);
  std::filesystem::remove(path("in/bad.txt"));
  write("in/x.jsonl", json_line("fine") + "{\"text\": 3}\n");
  EXPECT_TRUE(contains(error_of(options("out2")), "x.jsonl line 2: \"text\" is a JSON number, not a string"));
  write("in/x.jsonl", json_line("fine") + "\n{\"txt\": \"a\"}\n");
  EXPECT_TRUE(contains(error_of(options("out2")), "x.jsonl line 3: the object has no \"text\" field"));
  write("in/x.jsonl", "{\"text\": \"a\"\n");
  EXPECT_TRUE(contains(error_of(options("out2")), "x.jsonl line 1: not JSON"));
  write("in/x.jsonl", "[1]\n");
  EXPECT_TRUE(contains(error_of(options("out2")), "x.jsonl line 1: a JSON array"));
  write("in/x.jsonl", json_line("ok") + "\xFF\n");
  EXPECT_TRUE(contains(error_of(options("out2")), "x.jsonl line 2: byte 21 of the file is not valid UTF-8"))
      << error_of(options("out2"));
  std::filesystem::remove(path("in/x.jsonl"));
  // The output folder: an input, or holding shards already.
  EXPECT_TRUE(contains(error_of(options("in")), "is also the input"));
  EXPECT_TRUE(contains(error_of(options("out")), "holds shards already (train_000000.bin)"));
  write("in/good.txt", "hello");
  CorpusOptions again = options("out");
  again.overwrite = true;
  write("out/train_000009.bin", "stale");
  run(t, again);
  EXPECT_FALSE(std::filesystem::exists(path("out/train_000009.bin")));
  write("in/other.md", "x");
  EXPECT_TRUE(contains(message_of([&] {
                         CorpusOptions o = options("out3");
                         o.inputs = {path("in/other.md")};
                         run(t, o);
                       }),
                       "tokenize reads .txt files"));
}
