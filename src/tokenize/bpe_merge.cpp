#include "tokenize/bpe_merge.h"

#include <queue>

#include "core/error.h"

namespace meshtrain::tokenize {

namespace {

// The rank of the token piece[begin, end) (each byte is one in a byte-level vocabulary).
uint32_t part_rank(const RankTable& ranks, std::string_view piece, size_t begin, size_t end) {
  const uint32_t rank = ranks.find(piece.substr(begin, end - begin));
  MT_CHECK(rank != kNoRank, "the BPE vocabulary has no token for byte(s) {:?} of a piece: not a byte-level BPE",
           piece.substr(begin, end - begin));
  return rank;
}

}  // namespace

void bpe_merge_scan(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out) {
  if (piece.empty()) return;
  // parts[i]: its start, the rank of it joined with part i + 1, and its own
  // token's rank; two sentinels at the end.
  struct Part {
    size_t start;
    uint32_t rank, token;
  };
  std::vector<Part> parts;
  parts.reserve(piece.size() + 1);
  for (size_t i = 0; i + 1 < piece.size(); ++i)
    parts.push_back({i, ranks.find(piece.substr(i, 2)), part_rank(ranks, piece, i, i + 1)});
  parts.push_back({piece.size() - 1, kNoRank, part_rank(ranks, piece, piece.size() - 1, piece.size())});
  parts.push_back({piece.size(), kNoRank, kNoRank});
  // Part i joined with the part after part i + 1 (which is about to merge away).
  const auto joined_rank = [&](size_t i) {
    if (i + 3 >= parts.size()) return kNoRank;
    return ranks.find(piece.substr(parts[i].start, parts[i + 3].start - parts[i].start));
  };
  for (;;) {
    size_t best = 0;
    uint32_t best_rank = kNoRank;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].rank < best_rank) best_rank = parts[i].rank, best = i;
    if (best_rank == kNoRank) break;
    if (best > 0) parts[best - 1].rank = joined_rank(best - 1);
    parts[best].rank = joined_rank(best);
    parts[best].token = best_rank;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) out.push_back(parts[i].token);
}

void bpe_merge_heap(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out) {
  // Parts as a linked list of their start offsets; the heap holds candidate
  // pairs (rank, start, end of the pair), stale once either part changed.
  const size_t n = piece.size();
  if (n == 0) return;
  std::vector<size_t> next(n), prev(n);
  std::vector<uint32_t> token(n);  // the rank of the part that starts there
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i)  // prev[0] wraps: never read
    next[i] = i + 1, prev[i] = i - 1, token[i] = part_rank(ranks, piece, i, i + 1);
  struct Pair {
    uint32_t rank;
    size_t start, end;
    bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::priority_queue<Pair, std::vector<Pair>, std::greater<>> heap;
  const auto push = [&](size_t start) {
    if (next[start] >= n) return;
    const size_t end = next[next[start]];
    const uint32_t rank = ranks.find(piece.substr(start, end - start));
    if (rank != kNoRank) heap.push({rank, start, end});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Pair p = heap.top();
    heap.pop();
    if (!alive[p.start] || next[p.start] >= n || next[next[p.start]] != p.end) continue;
    const size_t gone = next[p.start];
    alive[gone] = 0;
    token[p.start] = p.rank;
    next[p.start] = next[gone];
    if (next[gone] < n) prev[next[gone]] = p.start;
    if (p.start > 0) push(prev[p.start]);
    push(p.start);
  }
  for (size_t s = 0; s < n; s = next[s]) out.push_back(token[s]);
}

void bpe_merge(const RankTable& ranks, std::string_view piece, std::vector<uint32_t>& out) {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(part_rank(ranks, piece, 0, 1));
    return;
  }
  if (piece.size() >= kHeapMergeFrom)
    bpe_merge_heap(ranks, piece, out);
  else
    bpe_merge_scan(ranks, piece, out);
}

}  // namespace meshtrain::tokenize
