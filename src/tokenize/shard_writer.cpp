#include "tokenize/shard_writer.h"

#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "core/file_io.h"

namespace meshtrain::tokenize {

namespace {
constexpr size_t kHeaderBytes = kLlmcHeaderBytes;
}

std::string shard_path(const std::string& dir, const std::string& split, int64_t index) {
  return fmt::format("{}/{}_{:06d}.bin", dir, split, index);
}

ShardWriter::ShardWriter(std::string dir, std::string split, int64_t shard_tokens, uint32_t max_id)
    : dir_(std::move(dir)),
      split_(std::move(split)),
      shard_tokens_(shard_tokens),
      format_(llmc_shard_format_for(max_id)) {
  MT_CHECK(shard_tokens > 0 && shard_tokens <= INT32_MAX,
           "--shard-tokens {}: a shard holds 1 to {} tokens (its llm.c header counts them in an int32)", shard_tokens,
           INT32_MAX);
  bytes_.resize(kHeaderBytes);
}

void ShardWriter::append(std::span<const uint32_t> tokens) {
  while (!tokens.empty()) {
    const size_t take = std::min(tokens.size(), static_cast<size_t>(shard_tokens_ - held_));
    const size_t at = bytes_.size();
    bytes_.resize(at + take * static_cast<size_t>(format_.width));
    if (format_.width == 4) {
      std::memcpy(bytes_.data() + at, tokens.data(), take * 4);
    } else {
      for (size_t i = 0; i < take; ++i) {
        const auto id = static_cast<uint16_t>(tokens[i]);
        std::memcpy(bytes_.data() + at + 2 * i, &id, 2);
      }
    }
    held_ += static_cast<int64_t>(take);
    tokens_ += static_cast<int64_t>(take);
    tokens = tokens.subspan(take);
    if (held_ == shard_tokens_) write_shard();
  }
}

void ShardWriter::finish() {
  if (held_ > 0) write_shard();
}

void ShardWriter::write_shard() {
  const int32_t header[3] = {format_.magic, format_.version, static_cast<int32_t>(held_)};
  std::memset(bytes_.data(), 0, kHeaderBytes);
  std::memcpy(bytes_.data(), header, sizeof(header));
  const std::string path = shard_path(dir_, split_, static_cast<int64_t>(paths_.size()));
  AtomicFile file(path);
  file.write(bytes_.data(), bytes_.size());
  file.commit();
  paths_.push_back(path);
  bytes_.resize(kHeaderBytes);
  held_ = 0;
}

}  // namespace meshtrain::tokenize
