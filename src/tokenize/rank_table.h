// The byte strings of a BPE vocabulary and their ranks: an open-addressing
// hash table over one arena of bytes, looked up by string_view (the merge
// loop asks it for the rank of every adjacent pair it considers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::tokenize {

constexpr uint32_t kNoRank = UINT32_MAX;

class RankTable {
 public:
  // Adds `bytes` with `rank`; false (and nothing added) when `bytes` is there already.
  bool insert(std::string_view bytes, uint32_t rank);
  RankTable() : short_(256 + 65536, kNoRank) {}
  // The rank of `bytes`, or kNoRank.
  uint32_t find(std::string_view bytes) const {
    if (bytes.size() - 1 < 2) return short_[short_index(bytes)];  // 1 or 2 bytes
    if (slots_.empty()) return kNoRank;
    const uint64_t h = hash(bytes);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.length == kEmpty) return kNoRank;
      if (s.tag == static_cast<uint32_t>(h >> 32) && s.length == bytes.size() &&
          arena_.compare(s.offset, s.length, bytes) == 0)
        return s.rank;
    }
  }
  size_t size() const { return count_; }
  // Every entry, as (bytes, rank), in no particular order.
  std::vector<std::pair<std::string_view, uint32_t>> entries() const;

  static uint64_t hash(std::string_view bytes);

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;
  struct Slot {
    uint32_t offset = 0, length = kEmpty, rank = 0, tag = 0;
  };
  // Tokens of 1 and 2 bytes are also in short_, at a byte's value or 256 +
  // two bytes' (the merge loops ask for pairs most).
  static size_t short_index(std::string_view bytes) {
    const auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<unsigned char>(bytes[i])); };
    return bytes.size() == 1 ? byte(0) : 256 + (byte(0) << 8 | byte(1));
  }
  void grow();
  void place(const Slot& slot, uint64_t h);

  std::vector<uint32_t> short_;
  std::string arena_;
  std::vector<Slot> slots_;
  size_t mask_ = 0, count_ = 0;
};

}  // namespace meshtrain::tokenize
