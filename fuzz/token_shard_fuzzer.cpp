// libFuzzer target: a token file (train::TokenLoader): an llm.c .bin shard,
// or a .txt file read as bytes. The first byte picks the kind, the batch
// size (1 to 4) and the sequence length (1 to 32); the rest is the file,
// which the fuzzer decodes itself as data.h describes the formats (a .txt
// file's bytes; a shard's 1024-byte header, magic 20240520 version 1 with
// uint16 tokens or magic 20240801 version 7 with uint32, then exactly the
// count of tokens it gives). The loader must accept exactly the files that
// decode with one batch's tokens (B*T + 1) or more, and report their count
// and largest token; each batch's inputs must be the file's tokens from the
// cursor on (row b at cursor + b*T), the targets the same one token later,
// the cursor advancing by B*T and wrapping to 0 when the next batch would run
// past the end, over the whole file and past a wrap; and set_cursor must
// take exactly the positions a batch starts at, and go on from there.
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "train/data.h"

using namespace meshtrain;

namespace {

// The file's tokens, decoded here from its bytes, or nothing for a file that is not a shard.
std::optional<std::vector<int64_t>> decode(bool shard, const uint8_t* bytes, size_t size) {
  std::vector<int64_t> tokens;
  if (!shard) {
    tokens.assign(bytes, bytes + size);
    return tokens;
  }
  if (size < 1024) return std::nullopt;
  int32_t magic, version, count;
  std::memcpy(&magic, bytes, 4);
  std::memcpy(&version, bytes + 4, 4);
  std::memcpy(&count, bytes + 8, 4);
  size_t width = 0;
  if (magic == 20240520 && version == 1) width = 2;
  if (magic == 20240801 && version == 7) width = 4;
  if (width == 0 || count < 0 || size - 1024 != static_cast<size_t>(count) * width) return std::nullopt;
  for (size_t at = 1024; at < size; at += width) {
    if (width == 2) {
      uint16_t t;
      std::memcpy(&t, bytes + at, 2);
      tokens.push_back(t);
    } else {
      uint32_t t;
      std::memcpy(&t, bytes + at, 4);
      tokens.push_back(t);
    }
  }
  return tokens;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool shard = (data[0] & 1) != 0;
  const int64_t batch = 1 + ((data[0] >> 1) & 3), seq_len = 1 + (data[0] >> 3), n = batch * seq_len;
  const std::string path = fuzz::write_input(shard ? "tokens.bin" : "tokens.txt", fuzz::as_text(data + 1, size - 1));
  const std::optional<std::vector<int64_t>> file = decode(shard, data + 1, size - 1);
  const bool usable = file && static_cast<int64_t>(file->size()) >= n + 1;
  std::optional<train::TokenLoader> loader;
  try {
    loader.emplace(path, batch, seq_len);
  } catch (const meshtrain::Error&) {
    fuzz::require(!usable);  // a clear error, for a file that is not a shard or too short
    return 0;
  }
  fuzz::require(usable);
  const std::vector<int64_t>& tokens = *file;
  const auto count = static_cast<int64_t>(tokens.size());
  fuzz::require(loader->num_tokens() == count);
  fuzz::require(loader->max_token() == *std::max_element(tokens.begin(), tokens.end()));
  fuzz::require(loader->cursor() == 0);

  Tensor inputs = Tensor::empty(Shape({batch, seq_len}), DType::i64);
  Tensor targets = Tensor::empty(Shape({batch, seq_len}), DType::i64);
  // One batch from the loader: its tokens are the file's from `cursor` on.
  auto check_next = [&](int64_t cursor) {
    fuzz::require(loader->cursor() == cursor);
    loader->next(inputs, targets);
    const auto in = inputs.data<int64_t>(), out = targets.data<int64_t>();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < seq_len; ++t) {
        const int64_t k = b * seq_len + t, at = cursor + k;
        fuzz::require(in[static_cast<size_t>(k)] == tokens[static_cast<size_t>(at)]);
        fuzz::require(out[static_cast<size_t>(k)] == tokens[static_cast<size_t>(at + 1)]);
      }
    const int64_t after = cursor + n;
    return after + n + 1 > count ? 0 : after;  // where the next batch starts
  };
  // Through the file and past its wrap (at most 64 batches).
  const int64_t batches = std::min<int64_t>(count / n + 2, 64);
  int64_t cursor = 0;
  for (int64_t i = 0; i < batches; ++i) cursor = check_next(cursor);

  // set_cursor: a multiple of B*T with a whole batch and its last target after it.
  const int64_t wanted = size > 1 ? data[size - 1] % (count + 2) : 0;
  const bool starts_batch = wanted % n == 0 && wanted + n + 1 <= count;
  try {
    loader->set_cursor(wanted);
  } catch (const meshtrain::Error&) {
    fuzz::require(!starts_batch && loader->cursor() == cursor);
    return 0;
  }
  fuzz::require(starts_batch);
  check_next(wanted);
  return 0;
}
