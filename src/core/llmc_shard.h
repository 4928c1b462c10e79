// The llm.c token shard formats (llm.c's dev/data/data_common.py): a header
// of 256 int32 (magic, version, token count) then the tokens at a width.
// One definition for the reader (train/data.h) and the writer
// (tokenize/shard_writer.h).
#pragma once

#include <cstdint>

namespace meshtrain {

struct LlmcShardFormat {
  int32_t magic, version;
  uint64_t width;  // bytes a token takes
  const char* name;
};
inline constexpr LlmcShardFormat kLlmcShardFormats[] = {{20240520, 1, 2, "GPT-2, uint16 tokens"},
                                                        {20240801, 7, 4, "Llama-3, uint32 tokens"}};
inline constexpr uint64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

// The narrowest format that holds ids up to `max_id`.
constexpr const LlmcShardFormat& llmc_shard_format_for(uint32_t max_id) {
  return max_id <= UINT16_MAX ? kLlmcShardFormats[0] : kLlmcShardFormats[1];
}

}  // namespace meshtrain
