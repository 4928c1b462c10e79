// The token loader (train/data.h): .txt bytes, llm.c GPT-2 (uint16) and
// Llama-3 (uint32) shards read at their width from a mapping, the cursor,
// the streamed digest (core's file_digest, byte for byte) and largest token,
// each header error, and a resident memory that stays a window of the file.
#include "train/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/file_io.h"
#include "core/hash.h"
#include "test_util.h"
#include "token_shards.h"

using namespace meshtrain;
using mtest::contains;
using mtest::int64_values;
using mtest::kGpt2Magic;
using mtest::kLlama3Magic;
using mtest::message_of;

namespace {

// A scratch folder, removed with the fixture.
class TokenData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("meshtrain_data_{}", ::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // An llm.c shard: the 256 x int32 header, then `tokens` of type T.
  template <typename T>
  std::string write_shard(const std::string& name, int32_t magic, int32_t version, int32_t count,
                          const std::vector<T>& tokens) const {
    int32_t header[256] = {magic, version, count};
    std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
    bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(T));
    return write(name, bytes);
  }
  std::string error_of(const std::string& file, int64_t batch = 1, int64_t seq_len = 4) const {
    return message_of([&] { train::TokenLoader(file, batch, seq_len); });
  }

  std::filesystem::path dir_;
};

// The inputs and targets of the loader's next batch.
std::pair<std::vector<int64_t>, std::vector<int64_t>> next_batch(train::TokenLoader& loader, int64_t batch,
                                                                 int64_t seq_len) {
  Tensor in = Tensor::empty({batch, seq_len}, DType::i64), out = Tensor::empty({batch, seq_len}, DType::i64);
  loader.next(in, out);
  return {int64_values(in), int64_values(out)};
}

// The resident bytes of the mapping of `file` in this process (/proc/self/smaps), 0 when it is not mapped.
int64_t resident_bytes_of_mapping(const std::string& file) {
  std::ifstream smaps("/proc/self/smaps");
  bool in_mapping = false;
  for (std::string line; std::getline(smaps, line);) {
    const std::string first = line.substr(0, line.find(' '));
    if (contains(first, "-")) in_mapping = contains(line, file);  // "ADDRESS-ADDRESS r--p ... PATH" starts a mapping
    if (in_mapping && first == "Rss:") return std::stoll(line.substr(4)) * 1024;
  }
  return 0;
}

}  // namespace

TEST_F(TokenData, TextBytesAreTokensUpTo255) {
  const std::string file = write("bytes.txt", std::string("\x00\x7f\x80\xc8\xff"
                                                          "ab",
                                                          7));
  train::TokenLoader loader(file, 1, 4);
  EXPECT_EQ(loader.num_tokens(), 7);
  EXPECT_EQ(loader.max_token(), 255);
  const auto [in, out] = next_batch(loader, 1, 4);
  EXPECT_EQ(in, (std::vector<int64_t>{0, 127, 128, 200}));  // bytes >= 128 are 128..255, not negative
  EXPECT_EQ(out, (std::vector<int64_t>{127, 128, 200, 255}));
}

TEST_F(TokenData, Gpt2ShardIsUint16) {
  const std::string file = write_shard<uint16_t>("gpt2.bin", kGpt2Magic, 1, 6, {50256, 1, 65535, 3, 4, 5});
  train::TokenLoader loader(file, 1, 3);
  EXPECT_EQ(loader.num_tokens(), 6);
  EXPECT_EQ(loader.max_token(), 65535);
  const auto [in, out] = next_batch(loader, 1, 3);
  EXPECT_EQ(in, (std::vector<int64_t>{50256, 1, 65535}));
  EXPECT_EQ(out, (std::vector<int64_t>{1, 65535, 3}));
}

TEST_F(TokenData, Llama3ShardIsUint32) {
  const std::string file =
      write_shard<uint32_t>("llama3.bin", kLlama3Magic, 7, 6, {128000, 70000, 65536, 9, 128255, 4000000000u});
  train::TokenLoader loader(file, 1, 4);
  EXPECT_EQ(loader.num_tokens(), 6);
  EXPECT_EQ(loader.max_token(), 4000000000);
  const auto [in, out] = next_batch(loader, 1, 4);
  EXPECT_EQ(in, (std::vector<int64_t>{128000, 70000, 65536, 9}));
  EXPECT_EQ(out, (std::vector<int64_t>{70000, 65536, 9, 128255}));
}

TEST_F(TokenData, CursorWrapsAndSetCursorChecks) {
  std::vector<uint16_t> tokens(11);
  for (uint16_t t = 0; t < 11; ++t) tokens[t] = t;
  train::TokenLoader loader(write_shard("eleven.bin", kGpt2Magic, 1, 11, tokens), 2, 2);
  EXPECT_EQ(next_batch(loader, 2, 2).first, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(loader.cursor(), 4);
  // Tokens 4..8; the next batch would need tokens up to 12 of 11: back to 0.
  EXPECT_EQ(next_batch(loader, 2, 2).second, (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(loader.cursor(), 0);
  EXPECT_EQ(next_batch(loader, 2, 2).first[0], 0);
  loader.set_cursor(4);
  EXPECT_EQ(next_batch(loader, 2, 2).first, (std::vector<int64_t>{4, 5, 6, 7}));
  for (const int64_t bad : {-4, 3, 8})
    EXPECT_TRUE(
        contains(message_of([&] { loader.set_cursor(bad); }),
                 fmt::format("data cursor {} is not where a batch of 4 tokens starts in 11 tokens of data", bad)));
  Tensor wrong = Tensor::empty({1, 3}, DType::i64), right = Tensor::empty({2, 2}, DType::i64);
  EXPECT_TRUE(contains(message_of([&] { loader.next(wrong, right); }), "batch tensors must hold 4 tokens"));
}

// Files of several 1 MiB pieces: the digest is file_digest's, the largest
// token is found in any piece, at the first and the last byte too.
TEST_F(TokenData, DigestIsFileDigestAndMaxTokenSpansPieces) {
  std::string text(3 * (1 << 20) + 7, 'a');
  text[1 << 20] = 'z';
  const std::string txt = write("pieces.txt", text);
  train::TokenLoader loader(txt, 4, 64);
  EXPECT_EQ(loader.digest(), file_digest(txt));
  EXPECT_EQ(loader.digest(), fmt::format("{} bytes, FNV-1a {:016x}", text.size(), fnv1a(text)));
  EXPECT_EQ(loader.max_token(), 'z');
  text.back() = '\xfe';
  EXPECT_EQ(train::TokenLoader(write("last.txt", text), 4, 64).max_token(), 254);

  std::vector<uint16_t> tokens(1 << 20, 7);  // 2 MiB of tokens after the 1 KiB header: three pieces
  tokens.back() = 40000;
  const std::string shard = write_shard("pieces.bin", kGpt2Magic, 1, 1 << 20, tokens);
  train::TokenLoader from_shard(shard, 8, 128);
  EXPECT_EQ(from_shard.digest(), file_digest(shard));
  EXPECT_EQ(from_shard.max_token(), 40000);
  tokens.back() = 7;
  tokens.front() = 41000;
  EXPECT_EQ(train::TokenLoader(write_shard("first.bin", kGpt2Magic, 1, 1 << 20, tokens), 8, 128).max_token(), 41000);
}

TEST_F(TokenData, FileDigestFormat) {
  EXPECT_EQ(file_digest(write("abc.txt", "abc")), "3 bytes, FNV-1a e71fa2190541574b");
  EXPECT_EQ(file_digest(path("missing.txt")), "(not readable)");
}

TEST_F(TokenData, FileErrors) {
  EXPECT_TRUE(contains(error_of(path("nope.txt")), "data file '" + path("nope.txt") + "' does not exist"));
  EXPECT_TRUE(contains(error_of(dir_.string()), "is not a file; give a .txt file or an llm.c .bin token shard"));
  EXPECT_TRUE(contains(error_of(write("empty.txt", "")),
                       "empty.txt holds 0 tokens, fewer than one batch needs (batch_size 1 x seq_len 4 + 1)"));
  EXPECT_TRUE(contains(error_of(write("short.txt", "abc"), 2, 4),
                       "holds 3 tokens, fewer than one batch needs (batch_size 2 x seq_len 4 + 1)"));
  EXPECT_TRUE(contains(error_of(write_shard<uint16_t>("few.bin", kGpt2Magic, 1, 4, {1, 2, 3, 4})),
                       "few.bin holds 4 tokens, fewer than one batch needs"));
}

TEST_F(TokenData, ShardHeaderErrors) {
  EXPECT_TRUE(contains(error_of(write("empty.bin", "")), "0 bytes is shorter than the 1024-byte llm.c header"));
  EXPECT_TRUE(contains(error_of(write("tiny.bin", std::string(100, '\1'))),
                       "100 bytes is shorter than the 1024-byte llm.c header"));
  EXPECT_TRUE(contains(error_of(write_shard<uint16_t>("magic.bin", 12345, 1, 0, {})),
                       "bad magic 12345 (an llm.c token shard starts with 20240520 or 20240801)"));
  const std::string v2 = error_of(write_shard<uint16_t>("v2.bin", kGpt2Magic, 2, 0, {}));
  EXPECT_TRUE(contains(v2,
                       "llm.c shard version 2 of magic 20240520 is not supported (expected 1; supported: "
                       "version 1 of magic 20240520 (GPT-2, uint16 tokens) or version 7 of magic 20240801 "
                       "(Llama-3, uint32 tokens))"))
      << v2;
  EXPECT_TRUE(contains(error_of(write_shard<uint32_t>("v1.bin", kLlama3Magic, 1, 0, {})),
                       "llm.c shard version 1 of magic 20240801 is not supported (expected 7;"));
  // Found by fuzz/token_shard_fuzzer: a negative count was 2^64 - 1 tokens.
  EXPECT_TRUE(contains(error_of(write_shard<uint16_t>("negative.bin", kGpt2Magic, 1, -1, {})),
                       "the llm.c header gives a token count of -1; a shard holds 0 or more"));
  EXPECT_TRUE(contains(error_of(write_shard("cut.bin", kGpt2Magic, 1, 1000, std::vector<uint16_t>(10))),
                       "is truncated: the header says 1000 tokens (2000 bytes) but only 20 bytes follow it"));
  EXPECT_TRUE(contains(error_of(write_shard("cut32.bin", kLlama3Magic, 7, 1000, std::vector<uint32_t>(10))),
                       "is truncated: the header says 1000 tokens (4000 bytes) but only 40 bytes follow it"));
  EXPECT_TRUE(contains(error_of(write_shard("long.bin", kLlama3Magic, 7, 8, std::vector<uint32_t>(9))),
                       "the header says 8 tokens (32 bytes) but 36 bytes follow it: 4 bytes past the shard"));
}

// Read through 256 MiB (a sparse file), the mapping's resident pages stay a
// window of 64 MiB or so behind the cursor, not the part of the file read.
TEST_F(TokenData, ResidentMemoryStaysAWindow) {
  const std::string file = path("big.txt");
  std::filesystem::resize_file(write("big.txt", ""), 256 << 20);
  const int64_t batch = 1, seq_len = 1 << 20;
  train::TokenLoader loader(file, batch, seq_len);
  EXPECT_EQ(loader.max_token(), 0);
  Tensor in = Tensor::empty({batch, seq_len}, DType::i64), out = Tensor::empty({batch, seq_len}, DType::i64);
  int64_t most = 0;
  for (int i = 0; i < 300; ++i) {  // past the end: it wraps
    loader.next(in, out);
    most = std::max(most, resident_bytes_of_mapping(file));
  }
  EXPECT_GT(most, 0);
  EXPECT_LT(most, 80 << 20) << "resident bytes of the mapping";
}
