// Token batches from a file, as llm.c's loader: a .txt file is read as bytes
// (vocabulary 256); a .bin file is an llm.c shard (256 x int32 header with
// magic 20240520, version 1, token count; then uint16 tokens). Each batch
// reads B*T+1 tokens at the cursor: inputs are the first B*T, targets the
// last B*T; the cursor advances by B*T and wraps to 0 when the next batch
// would run past the end.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace meshtrain::train {

class TokenLoader {
 public:
  TokenLoader(const std::string& path, int64_t batch, int64_t seq_len);
  // Fill i64 [B, T] inputs and targets.
  void next(Tensor& inputs, Tensor& targets);
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t max_token() const;
  // Where the next batch starts (a checkpoint keeps it); set_cursor throws
  // for a position no batch of this loader starts at.
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t cursor);

 private:
  std::vector<int64_t> tokens_;
  int64_t batch_, seq_len_, cursor_ = 0;
};

}  // namespace meshtrain::train
