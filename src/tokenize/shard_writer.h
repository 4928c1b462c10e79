// llm.c token shards of one split ("train", "val") in a folder: DIR/
// SPLIT_000000.bin, ... each a 256 x int32 header (magic, version, token
// count) then the tokens: uint16 (magic 20240520, version 1) when every id
// fits, else uint32 (magic 20240801, version 7), as train/data.h reads them.
// Every shard but the last holds exactly `shard_tokens` tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/llmc_shard.h"

namespace meshtrain::tokenize {

using ShardFormat = LlmcShardFormat;
// DIR/SPLIT_NNNNNN.bin
std::string shard_path(const std::string& dir, const std::string& split, int64_t index);

class ShardWriter {
 public:
  // Shards are written whole (core's AtomicFile) each time one fills.
  ShardWriter(std::string dir, std::string split, int64_t shard_tokens, uint32_t max_id);
  void append(std::span<const uint32_t> tokens);
  // Writes the last, partial shard (none when it would be empty).
  void finish();
  int64_t tokens() const { return tokens_; }
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  void write_shard();

  std::string dir_, split_;
  int64_t shard_tokens_;
  ShardFormat format_;
  std::vector<char> bytes_;  // the shard being filled, header first
  int64_t held_ = 0, tokens_ = 0;
  std::vector<std::string> paths_;
};

}  // namespace meshtrain::tokenize
