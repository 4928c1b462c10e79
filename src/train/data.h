// Token batches from one file or many shards, as llm.c's loader: a .txt file
// is read as bytes (vocabulary 256); a .bin file is an llm.c shard: a header
// of 256 int32 (magic, version, token count), then the tokens, uint16 in a
// GPT-2 shard (magic 20240520, version 1) or uint32 in a Llama-3 shard
// (magic 20240801, version 7). docs/data.md tells the rules in full.
//
// TokenDataset reads a file, a directory's .bin shards or a glob's. Shards
// are mapped read-only, one at a time, their tokens kept at their width, so
// a dataset of any size streams. Each batch reads B*T+1 tokens at the cursor
// (shard, offset) and never crosses a shard: inputs are the first B*T,
// targets the last B*T; the offset advances by B*T, and when the next batch
// would run past the shard's end the next shard of the epoch's order follows
// (after the last, the next epoch, in an order drawn from the seed).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/tensor.h"

namespace meshtrain::train {

// Rows [begin, end) of a [B, T] batch.
struct RowRange {
  int64_t begin = 0, end = 0;
};

// Where the next batch starts: the epoch, the shard (its place in the
// epoch's order and its name) and the token offset in it. A checkpoint keeps
// it; it is global (every rank has the same), whatever the layout.
struct DataCursor {
  int64_t epoch = 0;
  int64_t shard_index = 0;  // place in the epoch's order of shards
  std::string shard;        // the shard's name ("" : not recorded, as before datasets of shards)
  int64_t offset = 0;       // the batch's first token in the shard
};

class TokenDataset {
 public:
  // Lists the shards of `path` (a file, a directory or a glob), checks their
  // headers and reads each once, streamed: its digest and largest token.
  // `seed` draws each epoch's order of shards.
  // `key`: the config key that names `path`, as errors say it.
  TokenDataset(const std::string& path, int64_t batch, int64_t seq_len, int64_t seed = 0,
               const std::string& key = "data.path");
  ~TokenDataset();

  // Fill the rows `rows` (every row when empty) of i64 [B, T] inputs and
  // targets; the other rows are left as they were. Then step the cursor.
  void next(Tensor& inputs, Tensor& targets, std::span<const RowRange> rows = {});

  struct Shard {
    std::string path, name;  // name: the file's name (its path when two share one)
    int64_t tokens = 0, max_token = -1;
    std::string digest;  // core's file_digest
  };
  const std::vector<Shard>& shards() const { return shards_; }
  int64_t num_tokens() const;  // over every shard
  int64_t max_token() const;   // over every shard
  // The data's identity (checkpoints and the ranks' agreement): one file's
  // file_digest, or one digest over every shard's (name, digest) in order.
  const std::string& digest() const { return digest_; }
  // Throws naming the first shard that holds a token >= vocab_size.
  void check_vocabulary(int64_t vocab_size) const;

  DataCursor cursor() const;
  // Throws for a cursor no batch of this dataset starts at (a shard not in
  // it, another order, an offset off the batch grid).
  void set_cursor(const DataCursor& cursor);
  // The shards (indices into shards()) in epoch `epoch`'s order.
  std::vector<int64_t> order(int64_t epoch) const;
  // The batches shard `s` gives an epoch: (tokens - 1) / (B*T).
  int64_t batches_in(int64_t s) const;

  // Called with (shard index, first token, count) for each run of tokens a
  // batch's inputs take (tests record the rows read).
  using ReadObserver = std::function<void(int64_t shard, int64_t first, int64_t count)>;
  void on_read(ReadObserver observer) { observer_ = std::move(observer); }

 private:
  void list_and_scan(const std::string& path);
  const MappedFile& mapped();  // the current shard's mapping, made when needed
  void read_rows(const MappedFile& file, int64_t first, int64_t rows, int64_t* out) const;
  void advance();  // the cursor past the batch just read
  // Gives back the mapping's pages behind the cursor (64 MiB at a time; the
  // page cache keeps them), so that a run's resident memory stays bounded.
  void release_behind(bool wrapped);
  int64_t current() const { return order_[static_cast<size_t>(place_)]; }
  uint64_t byte_of(int64_t token) const { return header_ + static_cast<uint64_t>(token) * width_; }

  std::string key_;  // data.path or validation.path
  std::vector<Shard> shards_;
  uint64_t header_ = 0;  // bytes before the first token: an llm.c shard's header
  uint64_t width_ = 1;   // bytes a token takes: 1 (.txt), 2 or 4 (llm.c shards)
  std::string digest_;
  int64_t batch_, seq_len_, seed_;
  int64_t epoch_ = 0, place_ = 0, offset_ = 0;
  std::vector<int64_t> order_;       // epoch_'s
  std::unique_ptr<MappedFile> map_;  // of shard mapped_, or none
  int64_t mapped_ = -1;
  uint64_t released_ = 0;  // the mapping's pages below this byte are given back
  ReadObserver observer_;
};

// The files glob `path` matches, sorted; none when it is not a glob, names an
// existing path or matches nothing (outputs must not replace them; a
// directory's files are guarded as the directory's).
std::vector<std::string> glob_matches(const std::string& path);

// One file, as before datasets of shards: the cursor is the token offset.
class TokenLoader {
 public:
  TokenLoader(const std::string& path, int64_t batch, int64_t seq_len);
  void next(Tensor& inputs, Tensor& targets) { data_.next(inputs, targets); }
  int64_t num_tokens() const { return data_.num_tokens(); }
  int64_t max_token() const { return data_.max_token(); }
  const std::string& digest() const { return data_.digest(); }
  int64_t cursor() const { return data_.cursor().offset; }
  void set_cursor(int64_t cursor) { data_.set_cursor({0, 0, "", cursor}); }

 private:
  TokenDataset data_;
};

}  // namespace meshtrain::train
