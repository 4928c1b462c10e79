#include "core/copy.h"

#include <cstring>

#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

namespace meshtrain {

// 64 bytes a step, in vector registers as wide as the build's target has
// (32 bytes with AVX, as x86-64-v3 builds are; 16 with SSE2), by
// intrinsics rather than a loop the compiler could turn back into memcpy.
void copy_bytes(void* to, const void* from, size_t n) {
  auto* d = static_cast<std::byte*>(to);
  const auto* s = static_cast<const std::byte*>(from);
  size_t i = 0;
#if defined(__AVX__)
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
#elif defined(__SSE2__)
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
#endif
  if (i < n) std::memcpy(d + i, s + i, n - i);  // under 64 bytes: below the rep movsb path
}

void move_bytes(void* to, const void* from, size_t n) {
  auto* d = static_cast<std::byte*>(to);
  const auto* s = static_cast<const std::byte*>(from);
  if (d + n <= s || s + n <= d)
    copy_bytes(d, s, n);
  else if (d != s)
    std::memmove(d, s, n);
}

}  // namespace meshtrain
