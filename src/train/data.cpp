#include "train/data.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/llmc_shard.h"

namespace meshtrain::train {

namespace {
using ShardFormat = LlmcShardFormat;
constexpr const auto& kShardFormats = kLlmcShardFormats;
constexpr uint64_t kHeaderBytes = kLlmcHeaderBytes;
constexpr uint64_t kReleaseStride = 64 << 20;

std::string supported_shards() {
  return fmt::format("version {} of magic {} ({}) or version {} of magic {} ({})", kShardFormats[0].version,
                     kShardFormats[0].magic, kShardFormats[0].name, kShardFormats[1].version, kShardFormats[1].magic,
                     kShardFormats[1].name);
}

// The path, once it names a regular file.
const std::string& existing_file(const std::string& path) {
  MT_CHECK(std::filesystem::exists(path), "data file '{}' does not exist", path);
  MT_CHECK(std::filesystem::is_regular_file(path),
           "data file '{}' is not a file; give a .txt file or an llm.c .bin "
           "token shard",
           path);
  return path;
}

// The format of the llm.c shard `file` after its header's checks; sets the token count.
const ShardFormat& check_llmc_header(const std::string& path, const MappedFile& file, int64_t& count) {
  const uint64_t size = file.size();
  MT_CHECK(size >= kHeaderBytes, "data file {}: {} bytes is shorter than the 1024-byte llm.c header", path, size);
  int32_t header[3];
  std::memcpy(header, file.data(), sizeof(header));
  const auto* format = std::find_if(std::begin(kShardFormats), std::end(kShardFormats),
                                    [&](const ShardFormat& f) { return f.magic == header[0]; });
  MT_CHECK(format != std::end(kShardFormats), "data file {}: bad magic {} (an llm.c token shard starts with {} or {})",
           path, header[0], kShardFormats[0].magic, kShardFormats[1].magic);
  MT_CHECK(header[1] == format->version,
           "data file {}: llm.c shard version {} of magic {} is not supported (expected {}; supported: {})", path,
           header[1], header[0], format->version, supported_shards());
  MT_CHECK(header[2] >= 0, "data file {}: the llm.c header gives a token count of {}; a shard holds 0 or more", path,
           header[2]);
  const uint64_t tokens = static_cast<uint64_t>(header[2]), bytes = tokens * format->width,
                 follow = size - kHeaderBytes;
  MT_CHECK(follow >= bytes,
           "data file {} is truncated: the header says {} tokens ({} bytes) but only {} bytes follow it", path, tokens,
           bytes, follow);
  MT_CHECK(follow == bytes,
           "data file {}: the header says {} tokens ({} bytes) but {} bytes follow it: {} bytes past the shard "
           "(shards appended to one file?); give one llm.c shard per file",
           path, tokens, bytes, follow, follow - bytes);
  count = static_cast<int64_t>(tokens);
  return *format;
}

// The largest of the `count` tokens of type T at `bytes`: a loop the compiler vectorises.
template <typename T>
T max_of(const char* bytes, size_t count) {
  T largest = 0;
  for (size_t i = 0; i < count; ++i) {
    T t;
    std::memcpy(&t, bytes + i * sizeof(T), sizeof(T));
    largest = std::max(largest, t);
  }
  return largest;
}

int64_t max_token_of(const char* bytes, size_t count, uint64_t width) {
  if (width == 1) return max_of<uint8_t>(bytes, count);
  if (width == 2) return max_of<uint16_t>(bytes, count);
  MT_ASSERT(width == 4, "no tokens of {} bytes", width);
  return max_of<uint32_t>(bytes, count);
}

template <typename T>
void widen(const unsigned char* bytes, int64_t count, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    T t;
    std::memcpy(&t, bytes + i * sizeof(T), sizeof(T));
    out[i] = t;
  }
}
}  // namespace

TokenLoader::TokenLoader(const std::string& path, int64_t batch, int64_t seq_len)
    : file_(existing_file(path), "data file"), batch_(batch), seq_len_(seq_len) {
  if (std::filesystem::path(path).extension() == ".bin") {
    const ShardFormat& format = check_llmc_header(path, file_, num_tokens_);
    offset_ = kHeaderBytes;
    width_ = format.width;
  } else {
    num_tokens_ = static_cast<int64_t>(file_.size());
  }
  MT_CHECK(num_tokens() >= batch * seq_len + 1,
           "data file {} holds {} tokens, fewer than one batch needs (batch_size {} x seq_len {} + 1)", path,
           num_tokens(), batch, seq_len);
  scan(path);
  file_.advise(0, file_.size(), MADV_SEQUENTIAL);
}

void TokenLoader::scan(const std::string& path) {
  const uint64_t end = byte_of(num_tokens_);
  uint64_t at = 0;  // the bytes read so far
  const std::optional<std::string> digest = read_and_digest(file_.fd(), [&](std::string_view piece) {
    const uint64_t start = at;  // the piece's offset in the file
    at += piece.size();
    const uint64_t from = std::max(start, offset_), to = std::min(at, end);
    if (from < to)  // whole tokens: pieces of 1 MiB but the last, the header 1024 bytes
      max_token_ = std::max(max_token_, max_token_of(piece.data() + (from - start), (to - from) / width_, width_));
  });
  MT_CHECK(digest, "data file {}: could not read its {} bytes: {}", path, file_.size(), std::strerror(errno));
  MT_CHECK(at == file_.size(), "data file {} changed while it was read: {} bytes, then {}", path, file_.size(), at);
  digest_ = *digest;
}

void TokenLoader::read_tokens(int64_t first, int64_t count, int64_t* out) const {
  const unsigned char* bytes = file_.data() + byte_of(first);
  if (width_ == 1) widen<uint8_t>(bytes, count, out);
  if (width_ == 2) widen<uint16_t>(bytes, count, out);
  if (width_ == 4) widen<uint32_t>(bytes, count, out);
}

void TokenLoader::set_cursor(int64_t cursor) {
  const int64_t n = batch_ * seq_len_;
  MT_CHECK(cursor >= 0 && cursor % n == 0 && cursor + n + 1 <= num_tokens(),
           "data cursor {} is not where a batch of {} tokens starts in {} tokens of data: the data file or "
           "data.batch_size x data.seq_len changed since the checkpoint",
           cursor, n, num_tokens());
  cursor_ = cursor;
  released_ = 0;
}

void TokenLoader::next(Tensor& inputs, Tensor& targets) {
  const int64_t n = batch_ * seq_len_;
  auto in = inputs.data<int64_t>(), out = targets.data<int64_t>();
  MT_CHECK(static_cast<int64_t>(in.size()) == n && static_cast<int64_t>(out.size()) == n,
           "TokenLoader::next: batch tensors must hold {} tokens", n);
  read_tokens(cursor_, n, in.data());
  read_tokens(cursor_ + 1, n, out.data());
  cursor_ += n;
  const bool wrapped = cursor_ + n + 1 > num_tokens();
  if (wrapped) cursor_ = 0;
  release_behind(wrapped);
}

void TokenLoader::release_behind(bool wrapped) {
  const uint64_t upto = wrapped ? file_.size() : byte_of(cursor_);
  if (upto >= released_ + kReleaseStride) {
    file_.advise(released_, upto, MADV_DONTNEED);
    released_ = upto;
  }
  if (wrapped) released_ = 0;
}

}  // namespace meshtrain::train
