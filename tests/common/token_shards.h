// What the token data tests share: the llm.c shard headers' magic numbers
// (written out here, not taken from core/llmc_shard.h, so that the tests
// check the reader against the format) and a batch's tokens as a vector.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mtest {

constexpr int32_t kGpt2Magic = 20240520, kLlama3Magic = 20240801;

inline std::vector<int64_t> int64_values(const meshtrain::Tensor& t) {
  return {t.data<int64_t>().begin(), t.data<int64_t>().end()};
}

}  // namespace mtest
