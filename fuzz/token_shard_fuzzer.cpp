// libFuzzer target: a token file (train::TokenLoader): an llm.c .bin shard,
// or a .txt file read as bytes. The first byte picks the kind, the batch
// size and the sequence length; the rest is the file. Every batch it gives
// must hold tokens of the file, the targets shifted by one.
#include "fuzz/fuzz_input.h"
#include "train/data.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool shard = (data[0] & 1) != 0;
  const int64_t batch = 1 + ((data[0] >> 1) & 3), seq_len = 1 + (data[0] >> 3);
  const std::string path = fuzz::write_input(shard ? "tokens.bin" : "tokens.txt", fuzz::as_text(data + 1, size - 1));
  fuzz::expect_result_or_clear_error([&] {
    train::TokenLoader loader(path, batch, seq_len);
    fuzz::require(loader.num_tokens() >= batch * seq_len + 1);
    Tensor inputs = Tensor::empty(Shape({batch, seq_len}), DType::i64);
    Tensor targets = Tensor::empty(Shape({batch, seq_len}), DType::i64);
    for (int i = 0; i < 3; ++i) {
      loader.next(inputs, targets);
      const auto in = inputs.data<int64_t>(), out = targets.data<int64_t>();
      for (size_t k = 0; k < in.size(); ++k) {
        fuzz::require(in[k] >= 0 && in[k] <= loader.max_token());
        if (k + 1 < in.size()) fuzz::require(out[k] == in[k + 1]);
      }
    }
  });
  return 0;
}
