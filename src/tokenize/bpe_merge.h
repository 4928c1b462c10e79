// Byte-level BPE merging by rank, as tiktoken does it: the adjacent pair of
// parts whose joined bytes have the lowest rank merges first (the leftmost
// of equal ranks), until no joined pair is a token; each part is then a token.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenize/rank_table.h"

namespace meshtrain::tokenize {

// Pieces longer than this merge with a heap (O(n log n)); shorter ones by
// tiktoken's scan of the parts (O(n m), faster for the short pieces of text).
constexpr size_t kHeapMergeFrom = 128;

// Appends the ranks of `piece`'s tokens to `out`. Every part it ends with
// must be in `ranks` (each single byte is, in a byte-level vocabulary).
void bpe_merge(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out);
// The two algorithms on their own (the tests compare them).
void bpe_merge_scan(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out);
void bpe_merge_heap(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out);

}  // namespace meshtrain::tokenize
