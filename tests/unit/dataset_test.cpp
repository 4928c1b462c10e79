// Datasets of many shards (train/data.h, TokenDataset): batches are the
// shards' own tokens in each epoch's order, each data-parallel group reads
// every token of an epoch once, the order is a function of (seed, epoch), a
// single file reads as before, the cursor resumes exactly, and bad inputs
// are clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "test_util.h"
#include "token_shards.h"
#include "train/data.h"
#include "train/trainer.h"

using namespace meshtrain;
using mtest::contains;
using mtest::int64_values;
using mtest::kGpt2Magic;
using mtest::kLlama3Magic;
using mtest::message_of;

namespace {

// A scratch folder of shards, removed with the fixture.
class Shards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("meshtrain_dataset_{}", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // An llm.c GPT-2 shard of `count` tokens: token i is base + i (mod 65536).
  std::string shard(const std::string& name, int32_t count, int base, int32_t magic = kGpt2Magic,
                    int32_t version = 1) const {
    std::filesystem::create_directories(std::filesystem::path(path(name)).parent_path());
    int32_t header[256] = {magic, version, count};
    std::ofstream f(path(name), std::ios::binary);
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (int32_t i = 0; i < count; ++i) {
      if (magic == kGpt2Magic) {
        const auto t = static_cast<uint16_t>(base + i);
        f.write(reinterpret_cast<const char*>(&t), sizeof(t));
      } else {
        const auto t = static_cast<uint32_t>(base + i);
        f.write(reinterpret_cast<const char*>(&t), sizeof(t));
      }
    }
    return path(name);
  }
  // Shards a.bin (41 tokens: 5 batches of 8), b.bin (20: 2), c.bin (5: none) and d.bin (33: 4) in `sub`.
  std::string four_shards(const std::string& sub = "set") const {
    shard(sub + "/a.bin", 41, 1000);
    shard(sub + "/b.bin", 20, 2000);
    shard(sub + "/c.bin", 5, 3000);
    shard(sub + "/d.bin", 33, 4000);
    return path(sub);
  }

  std::filesystem::path dir_;
};

struct Batch {
  std::vector<int64_t> in, out;
  bool operator==(const Batch&) const = default;
};
Batch next_batch(train::TokenDataset& data, int64_t batch, int64_t seq_len) {
  Tensor in = Tensor::empty({batch, seq_len}, DType::i64), out = Tensor::empty({batch, seq_len}, DType::i64);
  data.next(in, out);
  return {int64_values(in), int64_values(out)};
}

// The batch at token `offset` of a shard whose token i is base + i.
Batch expected(int base, int64_t offset, int64_t n) {
  Batch b;
  for (int64_t i = 0; i < n; ++i) {
    b.in.push_back(base + offset + i);
    b.out.push_back(base + offset + i + 1);
  }
  return b;
}

}  // namespace

TEST_F(Shards, BatchesAreEachShardsTokensInTheEpochsOrder) {
  train::TokenDataset data(four_shards(), 2, 4, 7);
  ASSERT_EQ(data.shards().size(), 4u);
  EXPECT_EQ(data.shards()[2].name, "c.bin");
  EXPECT_EQ(data.num_tokens(), 41 + 20 + 5 + 33);
  EXPECT_EQ(data.max_token(), 4032);
  const int bases[] = {1000, 2000, 3000, 4000};
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (const int64_t s : data.order(epoch)) {
      EXPECT_EQ(data.batches_in(s), std::vector<int64_t>({5, 2, 0, 4})[static_cast<size_t>(s)]);
      for (int64_t b = 0; b < data.batches_in(s); ++b) {
        const train::DataCursor c = data.cursor();
        EXPECT_EQ(c.epoch, epoch);
        EXPECT_EQ(c.shard, data.shards()[static_cast<size_t>(s)].name);
        EXPECT_EQ(c.offset, b * 8);
        EXPECT_EQ(next_batch(data, 2, 4), expected(bases[s], b * 8, 8)) << "epoch " << epoch << " shard " << s;
      }
    }
  }
  EXPECT_EQ(data.cursor().epoch, 3);
}

// Every rank of a data-parallel group reads only its rows; together they read each token of an epoch once: the
// first (tokens - 1) / (B T) x B T tokens of each shard that holds a batch.
TEST_F(Shards, EachDataParallelGroupReadsEveryTokenOfAnEpochOnce) {
  const std::string set = four_shards();
  const int64_t batch = 4, seq_len = 2, n = batch * seq_len;
  // Each layout: the rows every rank reads (flat dp 1, 2, 4: contiguous rows; a pipeline of 2 microbatches: row i
  // to microbatch i mod 2, as pipeline_runner takes them).
  const std::map<std::string, std::vector<std::vector<train::RowRange>>> layouts{
      {"dp 1", {{{0, 4}}}},
      {"dp 2", {{{0, 2}}, {{2, 4}}}},
      {"dp 4", {{{0, 1}}, {{1, 2}}, {{2, 3}}, {{3, 4}}}},
      {"pipeline microbatches", {{{0, 1}, {2, 3}}, {{1, 2}, {3, 4}}}}};
  for (const auto& [name, ranks] : layouts) {
    std::map<std::pair<int64_t, int64_t>, int> reads;  // (shard, token) -> times read
    int64_t batches = 0;
    for (const auto& rows : ranks) {
      train::TokenDataset data(set, batch, seq_len, 3);
      data.on_read([&](int64_t s, int64_t first, int64_t count) {
        for (int64_t t = first; t < first + count; ++t) ++reads[{s, t}];
      });
      batches = 0;
      for (int64_t s = 0; s < 4; ++s) batches += data.batches_in(s);
      Tensor in = Tensor::empty({batch, seq_len}, DType::i64), out = Tensor::empty({batch, seq_len}, DType::i64);
      for (int64_t b = 0; b < batches; ++b) data.next(in, out, rows);
      EXPECT_EQ(data.cursor().epoch, 1) << name;
    }
    int64_t expected_reads = 0;
    train::TokenDataset data(set, batch, seq_len, 3);
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t t = 0; t < data.batches_in(s) * n; ++t) {
        ++expected_reads;
        EXPECT_EQ((reads[{s, t}]), 1) << name << ": shard " << s << " token " << t;
      }
    EXPECT_EQ(static_cast<int64_t>(reads.size()), expected_reads) << name << ": tokens read past the epoch's";
    EXPECT_EQ(expected_reads, batches * n);
  }
}

// Only the rows asked for are filled: the others keep what they held.
TEST_F(Shards, RowsNotReadAreLeftAlone) {
  train::TokenDataset data(four_shards(), 2, 4, 0);
  const int base = 1000 * (1 + static_cast<int>(data.order(0)[0]));
  Tensor in = Tensor::empty({2, 4}, DType::i64), out = Tensor::empty({2, 4}, DType::i64);
  std::fill(in.data<int64_t>().begin(), in.data<int64_t>().end(), -7);
  std::fill(out.data<int64_t>().begin(), out.data<int64_t>().end(), -7);
  const train::RowRange second{1, 2};
  data.next(in, out, {&second, 1});
  EXPECT_EQ(int64_values(in), (std::vector<int64_t>{-7, -7, -7, -7, base + 4, base + 5, base + 6, base + 7}));
  EXPECT_EQ(int64_values(out), (std::vector<int64_t>{-7, -7, -7, -7, base + 5, base + 6, base + 7, base + 8}));
}

TEST_F(Shards, OrderIsDrawnFromSeedAndEpoch) {
  for (int i = 0; i < 8; ++i) shard(fmt::format("eight/s{}.bin", i), 9, i * 100);
  train::TokenDataset a(path("eight"), 1, 8, 1234), b(path("eight"), 1, 8, 1234), other(path("eight"), 1, 8, 99);
  std::set<std::vector<int64_t>> orders;
  for (int64_t e = 0; e < 5; ++e) {
    std::vector<int64_t> order = a.order(e);
    EXPECT_EQ(order, b.order(e)) << "epoch " << e;
    orders.insert(order);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7})) << "epoch " << e << " is not a permutation";
  }
  EXPECT_EQ(orders.size(), 5u) << "an epoch repeats another's order";
  EXPECT_NE(a.order(0), other.order(0));
  // Pinned: mt19937_64 and the draws are the standard's, the same on every platform and compiler.
  EXPECT_EQ(a.order(0), (std::vector<int64_t>{2, 4, 5, 3, 1, 0, 6, 7}));
}

// One file reads as the loader did before datasets of shards: batches at 0, B T, 2 B T, ... wrapping to 0 when the
// next would run past the end, whatever the seed.
TEST_F(Shards, OneFileReadsAsBefore) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += static_cast<char>('a' + i % 26);
  std::ofstream(path("one.txt"), std::ios::binary) << text;
  const std::string bin = shard("one.bin", 300, 500);
  for (const auto& [file, first] : {std::pair<std::string, std::function<int64_t(int64_t)>>{
                                        path("one.txt"), [&](int64_t i) { return text[static_cast<size_t>(i)]; }},
                                    {bin, [](int64_t i) { return 500 + i; }}}) {
    train::TokenDataset data(file, 3, 16, 12345);
    EXPECT_EQ(data.digest(), file_digest(file));
    int64_t cursor = 0;  // the old loader's
    for (int step = 0; step < 40; ++step) {
      Batch want;
      for (int64_t i = 0; i < 48; ++i) {
        want.in.push_back(first(cursor + i));
        want.out.push_back(first(cursor + i + 1));
      }
      EXPECT_EQ(data.cursor().offset, cursor);
      ASSERT_EQ(next_batch(data, 3, 16), want) << file << " step " << step;
      cursor += 48;
      if (cursor + 48 + 1 > 300) cursor = 0;
    }
  }
}

// A cursor saved mid-epoch and set on a new dataset gives the same batches after it, across shards and epochs.
TEST_F(Shards, CursorRestoresTheFollowingBatches) {
  const std::string set = four_shards();
  train::TokenDataset first(set, 2, 4, 5);
  for (int i = 0; i < 6; ++i) next_batch(first, 2, 4);
  const train::DataCursor saved = first.cursor();
  std::vector<Batch> after;
  for (int i = 0; i < 25; ++i) after.push_back(next_batch(first, 2, 4));
  train::TokenDataset second(set, 2, 4, 5);
  second.set_cursor(saved);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(next_batch(second, 2, 4), after[static_cast<size_t>(i)]) << "batch " << i;
  EXPECT_EQ(first.cursor().epoch, 2);
  EXPECT_EQ(second.cursor().shard, first.cursor().shard);

  train::DataCursor gone = saved;
  gone.shard = "z.bin";
  EXPECT_TRUE(contains(message_of([&] { second.set_cursor(gone); }),
                       "data cursor names shard 'z.bin', which is not in data.path (its 4 shards)"));
  train::DataCursor moved = saved;  // another shard's place in the order: another seed
  moved.shard_index = (saved.shard_index + 1) % 4;
  EXPECT_TRUE(contains(message_of([&] { second.set_cursor(moved); }), "the shards or training.seed changed"));
  train::DataCursor off = saved;
  off.offset += 3;
  EXPECT_TRUE(contains(message_of([&] { second.set_cursor(off); }), "is not where a batch of 8 tokens starts"));
}

// One file is known by its contents (its digest): a checkpoint's cursor naming it by another name (the file was
// renamed since) still resumes, as before datasets of shards.
TEST_F(Shards, OneRenamedFileResumes) {
  const std::string renamed = shard("renamed.bin", 100, 0);
  train::TokenDataset data(renamed, 2, 4);
  EXPECT_NO_THROW(data.set_cursor({0, 0, "original.bin", 16}));
  EXPECT_EQ(data.cursor().offset, 16);
}

// validation.path's errors name it, and a tokenize folder suggests its validation split.
TEST_F(Shards, ValidationPathErrorsNameTheKey) {
  shard("tok/train_000000.bin", 50, 0);
  shard("tok/val_000000.bin", 50, 0);
  const std::string message = message_of([&] { train::TokenDataset(path("tok"), 2, 4, 0, "validation.path"); });
  EXPECT_TRUE(contains(message, "validation.path " + path("tok") + " holds both train_ and val_ shards")) << message;
  EXPECT_TRUE(contains(message, "give the validation split's, validation.path = \"" + path("tok") + "/val_*.bin\""))
      << message;
  EXPECT_TRUE(contains(message_of([&] { train::TokenDataset(path("tok/x_*.bin"), 2, 4, 0, "validation.path"); }),
                       "validation.path " + path("tok/x_*.bin") + ": the glob matches no file"));
}

TEST_F(Shards, GlobAndDirectoryListTheSameSortedShards) {
  four_shards();
  shard("set/notes.bin.txt", 3, 0);  // neither .bin nor matched
  train::TokenDataset dir(path("set"), 2, 4), glob(path("set/*.bin"), 2, 4);
  EXPECT_EQ(dir.digest(), glob.digest());
  std::vector<std::string> names;
  for (const auto& s : glob.shards()) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a.bin", "b.bin", "c.bin", "d.bin"}));
  train::TokenDataset two(path("set/[ab].bin"), 2, 4);
  EXPECT_EQ(two.shards().size(), 2u);
  EXPECT_NE(two.digest(), dir.digest());
}

TEST_F(Shards, BadInputsAreClearErrors) {
  const auto error = [&](const std::string& p) { return message_of([&] { train::TokenDataset(p, 2, 4); }); };
  std::filesystem::create_directories(path("empty"));
  EXPECT_TRUE(contains(error(path("empty")), "is a directory with no .bin token shard in it")) << error(path("empty"));
  EXPECT_TRUE(contains(error(path("nothing/*.bin")), "the glob matches no file"));
  shard("mixed/a.bin", 20, 0);
  shard("mixed/b.bin", 20, 0, kLlama3Magic, 7);
  EXPECT_TRUE(contains(error(path("mixed")),
                       "shard b.bin is llm.c magic 20240801 version 7 but shard a.bin is llm.c "
                       "magic 20240520 version 1: every shard must have one format"))
      << error(path("mixed"));
  shard("badversion/a.bin", 20, 0);
  shard("badversion/b.bin", 20, 0, kGpt2Magic, 2);
  EXPECT_TRUE(contains(error(path("badversion")), "b.bin: llm.c shard version 2 of magic 20240520 is not supported"));
  shard("split/train_000000.bin", 20, 0);
  shard("split/val_000000.bin", 20, 0);
  EXPECT_TRUE(contains(error(path("split")),
                       "holds both train_ and val_ shards (meshtrain tokenize's splits); give "
                       "the training split's, data.path = \"" +
                           path("split/train_*.bin") + "\""))
      << error(path("split"));
  EXPECT_EQ(train::TokenDataset(path("split/train_*.bin"), 2, 4).shards().size(), 1u);
  shard("text/b.bin", 20, 0);
  std::ofstream(path("text/a.bin.txt")) << "hello";
  EXPECT_TRUE(contains(error(path("text/*")), "a.bin.txt is not an llm.c .bin shard; a .txt file is read only alone"))
      << error(path("text/*"));
  shard("short/a.bin", 5, 0);
  shard("short/b.bin", 8, 0);
  EXPECT_TRUE(contains(error(path("short")),
                       "no shard holds one batch (batch_size 2 x seq_len 4 + 1 tokens); the "
                       "longest holds 8"));
  // A shard whose tokens exceed the model's vocabulary, named.
  shard("vocab/a.bin", 20, 0);
  shard("vocab/b.bin", 20, 490);
  train::TokenDataset vocab(path("vocab"), 2, 4);
  EXPECT_NO_THROW(vocab.check_vocabulary(510));
  EXPECT_TRUE(contains(message_of([&] { vocab.check_vocabulary(509); }),
                       "data file " + path("vocab/b.bin") + " holds token 509 but model.vocab_size is 509"));
}

// An output named like a shard a glob data.path matches is refused: it would replace that shard.
TEST_F(Shards, OutputsMustNotReplaceAGlobsShards) {
  four_shards();
  config::TrainConfig config;
  config.data.path = path("set/*.bin");
  EXPECT_EQ(train::glob_matches(config.data.path).size(), 4u);
  EXPECT_TRUE(contains(message_of([&] { train::check_output_path(config, path("set/b.bin"), "--out"); }),
                       "--out " + path("set/b.bin") + " is also a shard of data.path"));
  EXPECT_NO_THROW(train::check_output_path(config, path("set/e.bin"), "--out"));
}

// Likewise a shard of a directory data.path, and of a glob validation.path.
TEST_F(Shards, OutputsMustNotReplaceADirectorysOrTheValidationSplitsShards) {
  four_shards();
  config::TrainConfig config;
  config.data.path = path("set");
  EXPECT_TRUE(contains(message_of([&] { train::check_output_path(config, path("set/c.bin"), "--out"); }),
                       "--out " + path("set/c.bin") + " is a file of data.path"));
  config.data.path = path("elsewhere.txt");
  config.validation.path = path("set/*.bin");
  EXPECT_TRUE(contains(message_of([&] { train::check_output_path(config, path("set/a.bin"), "--out"); }),
                       "--out " + path("set/a.bin") + " is also a shard of validation.path"));
}

// A shard cut short while training is an error naming it, not SIGBUS.
TEST_F(Shards, ShardTruncatedWhileTrainingIsAnError) {
  train::TokenDataset data(shard("cut.bin", 100, 0), 2, 4);
  next_batch(data, 2, 4);
  std::filesystem::resize_file(path("cut.bin"), 1024 + 20);
  EXPECT_TRUE(contains(message_of([&] { next_batch(data, 2, 4); }),
                       "cut.bin changed while training: 1224 bytes "
                       "when read, 1044 now"));
}
