#include "tokenize/rank_table.h"

#include <cstring>

namespace meshtrain::tokenize {

namespace {
uint64_t mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  return x ^ (x >> 32);
}
}  // namespace

uint64_t RankTable::hash(std::string_view bytes) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ bytes.size();
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = mix(h ^ word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
  return mix(h ^ tail ^ (static_cast<uint64_t>(bytes.size() - i) << 59));
}

bool RankTable::insert(std::string_view bytes, uint32_t rank) {
  if (find(bytes) != kNoRank) return false;
  if (bytes.size() - 1 < 2) short_[short_index(bytes)] = rank;
  if ((count_ + 1) * 2 > slots_.size()) grow();
  const Slot slot{static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(bytes.size()), rank,
                  static_cast<uint32_t>(hash(bytes) >> 32)};
  arena_.append(bytes);
  place(slot, hash(bytes));
  ++count_;
  return true;
}

void RankTable::place(const Slot& slot, uint64_t h) {
  size_t i = h & mask_;
  while (slots_[i].length != kEmpty) i = (i + 1) & mask_;
  slots_[i] = slot;
}

void RankTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
  mask_ = slots_.size() - 1;
  for (const Slot& s : old)
    if (s.length != kEmpty) place(s, hash(std::string_view(arena_).substr(s.offset, s.length)));
}

std::vector<std::pair<std::string_view, uint32_t>> RankTable::entries() const {
  std::vector<std::pair<std::string_view, uint32_t>> out;
  out.reserve(count_);
  for (const Slot& s : slots_)
    if (s.length != kEmpty) out.emplace_back(std::string_view(arena_).substr(s.offset, s.length), s.rank);
  return out;
}

}  // namespace meshtrain::tokenize
