#include "train/data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace meshtrain::train {

namespace {
constexpr int32_t kShardMagic = 20240520;

std::vector<int64_t> read_llmc_shard(const std::string& path, uint64_t file_size, std::ifstream& in) {
  int32_t header[256];
  MT_CHECK(file_size >= sizeof(header), "data file {}: {} bytes is shorter than the 1024-byte llm.c header", path,
           file_size);
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  MT_CHECK(header[0] == kShardMagic, "data file {}: bad magic {} (an llm.c token shard starts with {})", path,
           header[0], kShardMagic);
  MT_CHECK(header[1] == 1, "data file {}: llm.c shard version {} is not supported (expected 1)", path, header[1]);
  MT_CHECK(header[2] >= 0, "data file {}: the llm.c header gives a token count of {}; a shard holds 0 or more", path,
           header[2]);
  const auto count = static_cast<uint64_t>(header[2]);
  MT_CHECK(file_size >= sizeof(header) + 2 * count,
           "data file {} is truncated: the header says {} tokens ({} bytes) but only {} bytes follow it", path, count,
           2 * count, file_size - sizeof(header));
  MT_CHECK(file_size == sizeof(header) + 2 * count,
           "data file {}: the header says {} tokens ({} bytes) but {} bytes follow it: {} bytes past the shard "
           "(shards appended to one file?); give one llm.c shard per file",
           path, count, 2 * count, file_size - sizeof(header), file_size - sizeof(header) - 2 * count);
  std::vector<uint16_t> raw(count);
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(2 * count));
  MT_CHECK(in.good() || count == 0, "data file {}: could not read its {} tokens", path, count);
  return {raw.begin(), raw.end()};
}
}  // namespace

TokenLoader::TokenLoader(const std::string& path, int64_t batch, int64_t seq_len) : batch_(batch), seq_len_(seq_len) {
  MT_CHECK(std::filesystem::exists(path), "data file '{}' does not exist", path);
  MT_CHECK(std::filesystem::is_regular_file(path),
           "data file '{}' is not a file; give a .txt file or an llm.c .bin "
           "token shard",
           path);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "cannot open data file '{}': {}", path, std::strerror(errno));
  const auto size = static_cast<uint64_t>(std::filesystem::file_size(path));
  if (std::filesystem::path(path).extension() == ".bin") {
    tokens_ = read_llmc_shard(path, size, in);
  } else {
    std::vector<unsigned char> bytes(size);
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
    MT_CHECK(in.good() || size == 0, "data file {}: could not read its {} bytes", path, size);
    tokens_.assign(bytes.begin(), bytes.end());
  }
  MT_CHECK(num_tokens() >= batch * seq_len + 1,
           "data file {} holds {} tokens, fewer than one batch needs (batch_size {} x seq_len {} + 1)", path,
           num_tokens(), batch, seq_len);
}

int64_t TokenLoader::max_token() const {
  return tokens_.empty() ? -1 : *std::max_element(tokens_.begin(), tokens_.end());
}

void TokenLoader::set_cursor(int64_t cursor) {
  const int64_t n = batch_ * seq_len_;
  MT_CHECK(cursor >= 0 && cursor % n == 0 && cursor + n + 1 <= num_tokens(),
           "data cursor {} is not where a batch of {} tokens starts in {} tokens of data: the data file or "
           "data.batch_size x data.seq_len changed since the checkpoint",
           cursor, n, num_tokens());
  cursor_ = cursor;
}

void TokenLoader::next(Tensor& inputs, Tensor& targets) {
  const int64_t n = batch_ * seq_len_;
  auto in = inputs.data<int64_t>(), out = targets.data<int64_t>();
  MT_CHECK(static_cast<int64_t>(in.size()) == n && static_cast<int64_t>(out.size()) == n,
           "TokenLoader::next: batch tensors must hold {} tokens", n);
  std::copy_n(tokens_.begin() + cursor_, n, in.begin());
  std::copy_n(tokens_.begin() + cursor_ + 1, n, out.begin());
  cursor_ += n;
  if (cursor_ + n + 1 > num_tokens()) cursor_ = 0;
}

}  // namespace meshtrain::train
