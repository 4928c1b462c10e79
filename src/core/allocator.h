// Host memory allocator that caches freed blocks for reuse, with statistics.
// Blocks are 64-byte aligned. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace meshtrain {

struct AllocatorStats {
  size_t current_bytes = 0;   // bytes in blocks handed out and not yet freed
  size_t peak_bytes = 0;      // high-water mark of current_bytes
  size_t reserved_bytes = 0;  // current_bytes plus bytes cached for reuse
  uint64_t allocations = 0;   // calls to allocate
  uint64_t cache_hits = 0;    // allocations served from the cache
};

class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes);
  void deallocate(void* ptr);
  // Return every cached (unused) block to the system.
  void release_cache();
  AllocatorStats stats() const;
  void reset_peak();
  // The rounded size a request of `bytes` occupies (512 B granules up to 1 MiB, 128 KiB above).
  static size_t block_size(size_t bytes);

 private:
  void free_cached_locked();

  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;     // block size -> free block
  std::unordered_map<void*, size_t> live_;  // block -> block size
  AllocatorStats stats_;
};

// The process-wide allocator that Tensor uses by default.
CachingAllocator& default_allocator();

}  // namespace meshtrain
