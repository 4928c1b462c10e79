#include "core/allocator.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace meshtrain {

namespace {
constexpr size_t kAlignment = 64;
constexpr size_t kSmallGranule = 512;
constexpr size_t kLargeGranule = 128 * 1024;
constexpr size_t kSmallLimit = 1 << 20;
size_t round_up(size_t n, size_t g) { return (n + g - 1) / g * g; }
void* host_allocate(size_t bytes) { return std::aligned_alloc(kAlignment, round_up(bytes, kAlignment)); }
void host_free(void* ptr) { std::free(ptr); }
}  // namespace

MemorySource host_memory() { return {Device::cpu, "host", host_allocate, host_free}; }

CachingAllocator::CachingAllocator(MemorySource source) : source_(source) {
  MT_ASSERT(source_.allocate != nullptr && source_.free != nullptr, "memory source '{}' without allocate/free",
            source_.name);
}

size_t CachingAllocator::block_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  return bytes <= kSmallLimit ? round_up(bytes, kSmallGranule) : round_up(bytes, kLargeGranule);
}

CachingAllocator::~CachingAllocator() {
  release_cache();
  // Live blocks at exit belong to tensors that outlived the allocator (static
  // destruction order); freeing them here would leave dangling pointers, so leave them.
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = block_size(bytes);
  std::lock_guard lock(mu_);
  ++stats_.allocations;
  void* ptr = nullptr;
  // Best fit, but never hand out a block more than twice the request.
  auto it = cached_.lower_bound(size);
  size_t got = size;
  if (it != cached_.end() && it->first <= 2 * size) {
    ptr = it->second;
    got = it->first;
    cached_.erase(it);
    ++stats_.cache_hits;
  } else {
    ptr = source_.allocate(size);
    if (ptr == nullptr) {
      // Retry once after giving the cache back to the system.
      free_cached_locked();
      ptr = source_.allocate(size);
    }
    if (ptr == nullptr)
      throw Error(fmt::format("out of {} memory: allocating {} bytes failed ({} bytes in use)", source_.name, size,
                              stats_.current_bytes));
    stats_.reserved_bytes += size;
  }
  live_.emplace(ptr, got);
  stats_.current_bytes += got;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  return ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) throw Error(fmt::format("deallocate: pointer {} was not allocated by this allocator", ptr));
  stats_.current_bytes -= it->second;
  cached_.emplace(it->second, ptr);
  live_.erase(it);
}

void CachingAllocator::release_cache() {
  std::lock_guard lock(mu_);
  free_cached_locked();
}

void CachingAllocator::free_cached_locked() {
  for (auto& [size, ptr] : cached_) {
    source_.free(ptr);
    stats_.reserved_bytes -= size;
  }
  cached_.clear();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
}

CachingAllocator& default_allocator() {
  static auto* allocator = new CachingAllocator();  // never destroyed: tensors may outlive statics
  return *allocator;
}

}  // namespace meshtrain
