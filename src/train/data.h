// Token batches from a file, as llm.c's loader: a .txt file is read as bytes
// (vocabulary 256); a .bin file is an llm.c shard: a header of 256 int32
// (magic, version, token count), then the tokens, uint16 in a GPT-2 shard
// (magic 20240520, version 1) or uint32 in a Llama-3 shard (magic 20240801,
// version 7). The file is mapped read-only and its tokens kept at their
// width, so a file of any size streams. Each batch reads B*T+1 tokens at the
// cursor: inputs are the first B*T, targets the last B*T; the cursor
// advances by B*T and wraps to 0 when the next batch would run past the end.
#pragma once

#include <string>

#include "core/file_io.h"
#include "core/tensor.h"

namespace meshtrain::train {

class TokenLoader {
 public:
  // Checks the file and reads it once, streamed: its digest and largest token.
  TokenLoader(const std::string& path, int64_t batch, int64_t seq_len);
  // Fill i64 [B, T] inputs and targets.
  void next(Tensor& inputs, Tensor& targets);
  int64_t num_tokens() const { return num_tokens_; }
  int64_t max_token() const { return max_token_; }
  // core's file_digest of the file, as read at construction (checkpoints
  // and the ranks' agreement record it).
  const std::string& digest() const { return digest_; }
  // Where the next batch starts (a checkpoint keeps it); set_cursor throws
  // for a position no batch of this loader starts at.
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t cursor);

 private:
  void scan(const std::string& path);  // the streamed pass: digest_ and max_token_
  // Tokens [first, first + count) widened to i64 at `out`.
  void read_tokens(int64_t first, int64_t count, int64_t* out) const;
  // Gives back the mapping's pages behind the cursor (64 MiB at a time; the
  // page cache keeps them), so that a run's resident memory stays bounded.
  void release_behind(bool wrapped);
  uint64_t byte_of(int64_t token) const { return offset_ + static_cast<uint64_t>(token) * width_; }

  MappedFile file_;
  uint64_t offset_ = 0;  // bytes before the first token: an llm.c shard's header
  uint64_t width_ = 1;   // bytes a token takes: 1 (.txt), 2 or 4 (llm.c shards)
  int64_t num_tokens_ = 0, max_token_ = -1;
  std::string digest_;
  int64_t batch_, seq_len_, cursor_ = 0;
  uint64_t released_ = 0;  // the mapping's pages below this byte are given back
};

}  // namespace meshtrain::train
