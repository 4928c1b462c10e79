// memcpy against meshtrain's copy_bytes (core/copy.h) from 4 KiB to 4 MiB,
// with the destination at several distances past the source modulo 4 KiB:
// where glibc's memcpy takes its rep movsb path, a distance of 1 to 15
// bytes makes it many times slower on some CPUs (AMD Zen among them). The
// large sizes show what copy_bytes costs where memcpy is at its best.
// Usage: build/copy_alias
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "core/copy.h"

namespace {

template <typename Copy>
double us_per_copy(Copy copy, std::byte* to, const std::byte* from, size_t bytes) {
  const int kCopies = static_cast<int>(std::max<size_t>(40, (size_t{64} << 20) / bytes));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCopies; ++i) {
    copy(to + (i % 4) * (bytes + 4096), from + (i % 8) * (bytes + 4096), bytes);
    asm volatile("" ::: "memory");
  }
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kCopies;
}

}  // namespace

int main() {
  constexpr size_t kLargest = size_t{4} << 20;
  constexpr size_t kArena = 9 * (kLargest + 4096);  // 8 sources (4 destinations) a copy apart
  auto* from = static_cast<std::byte*>(std::aligned_alloc(4096, kArena));
  auto* to = static_cast<std::byte*>(std::aligned_alloc(4096, kArena));
  std::memset(from, 1, kArena);
  std::memset(to, 2, kArena);
  fmt::print("{:>8} {:>9} {:>12} {:>15}\n", "bytes", "distance", "memcpy_us", "copy_bytes_us");
  for (size_t bytes : {size_t{4096}, size_t{16384}, size_t{65536}, size_t{1} << 20, kLargest})
    for (int distance : {0, 8, 64, 1000}) {
      const auto glibc = [](void* t, const void* f, size_t n) { std::memcpy(t, f, n); };
      const double a = us_per_copy(glibc, to + 128 + distance, from + 128, bytes);
      const double b = us_per_copy(meshtrain::copy_bytes, to + 128 + distance, from + 128, bytes);
      fmt::print("{:>8} {:>9} {:>12.2f} {:>15.2f}\n", bytes, distance, a, b);
    }
  std::free(from);
  std::free(to);
}
