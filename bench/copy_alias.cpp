// memcpy against meshtrain's copy_bytes (core/copy.h) for 4, 16 and 64 KiB,
// with the destination at several distances past the source modulo 4 KiB:
// where glibc's memcpy takes its rep movsb path, a distance of 1 to 15
// bytes makes it many times slower on some CPUs (AMD Zen among them).
// Usage: build/copy_alias
#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "core/copy.h"

namespace {

template <typename Copy>
double us_per_copy(Copy copy, std::byte* to, const std::byte* from, size_t bytes) {
  constexpr int kCopies = 4000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCopies; ++i) {
    copy(to + (i % 4) * (bytes + 4096), from + (i % 8) * (bytes + 4096), bytes);
    asm volatile("" ::: "memory");
  }
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kCopies;
}

}  // namespace

int main() {
  constexpr size_t kArena = 1 << 20;
  auto* from = static_cast<std::byte*>(std::aligned_alloc(4096, kArena));
  auto* to = static_cast<std::byte*>(std::aligned_alloc(4096, kArena));
  std::memset(from, 1, kArena);
  std::memset(to, 2, kArena);
  fmt::print("{:>8} {:>9} {:>12} {:>15}\n", "bytes", "distance", "memcpy_us", "copy_bytes_us");
  for (size_t bytes : {size_t{4096}, size_t{16384}, size_t{65536}})
    for (int distance : {0, 8, 64, 1000}) {
      const auto glibc = [](void* t, const void* f, size_t n) { std::memcpy(t, f, n); };
      const double a = us_per_copy(glibc, to + 128 + distance, from + 128, bytes);
      const double b = us_per_copy(meshtrain::copy_bytes, to + 128 + distance, from + 128, bytes);
      fmt::print("{:>8} {:>9} {:>12.2f} {:>15.2f}\n", bytes, distance, a, b);
    }
  std::free(from);
  std::free(to);
}
