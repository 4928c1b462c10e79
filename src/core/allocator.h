// Memory allocator that caches freed blocks for reuse, with statistics: host
// memory by default, or any other memory (a GPU's, pinned host memory) given
// as a MemorySource. Host blocks are 64-byte aligned. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/device.h"

namespace meshtrain {

struct AllocatorStats {
  size_t current_bytes = 0;   // bytes in blocks handed out and not yet freed
  size_t peak_bytes = 0;      // high-water mark of current_bytes
  size_t reserved_bytes = 0;  // current_bytes plus bytes cached for reuse
  uint64_t allocations = 0;   // calls to allocate
  uint64_t cache_hits = 0;    // allocations served from the cache
};

// Where an allocator's blocks come from. allocate returns nullptr when the
// memory is exhausted (the allocator then frees its cache and tries once more).
struct MemorySource {
  Device device = Device::cpu;
  const char* name = "host";  // in out-of-memory errors: "out of {name} memory"
  void* (*allocate)(size_t bytes) = nullptr;
  void (*free)(void* ptr) = nullptr;
};
// Host memory from aligned_alloc (64-byte aligned).
MemorySource host_memory();

class CachingAllocator {
 public:
  CachingAllocator() : CachingAllocator(host_memory()) {}
  explicit CachingAllocator(MemorySource source);
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
  Device device() const { return source_.device; }

 private:
  void free_cached_locked();

  MemorySource source_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;     // block size -> free block
  std::unordered_map<void*, size_t> live_;  // block -> block size
  AllocatorStats stats_;
};

// The process-wide allocator that Tensor uses by default.
CachingAllocator& default_allocator();

}  // namespace meshtrain
