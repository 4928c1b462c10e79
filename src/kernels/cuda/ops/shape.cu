// CUDA kernels of the shape ops (graph/ops/shape.cpp): transpose, slice, slice_backward and concat, moving
// elements of any dtype as units of bits (1 to 16 bytes: the widest that the sizes and addresses allow).
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;     // transpose tiles of kTile x kTile units
constexpr int kTileRows = 8;  // rows of threads of a transpose block (each moves kTile / kTileRows units)
constexpr int kMaxBlocks = 65535 * 8;

__device__ __forceinline__ uint64_t first_thread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t thread_count() { return static_cast<uint64_t>(gridDim.x) * blockDim.x; }

// The widest unit (16, 8, 4, 2 or 1 bytes) dividing every value: byte sizes, offsets and addresses.
size_t widest_unit(std::initializer_list<uint64_t> values) {
  size_t unit = 16;
  for (const uint64_t v : values)
    while (v % unit != 0) unit /= 2;
  return unit;
}
uint64_t address_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Run fn with a value of the type that moves `bytes` bytes at once.
template <typename Fn>
void by_unit(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 16:
      return fn(uint4{});
    case 8:
      return fn(uint2{});
    case 4:
      return fn(uint32_t{});
    case 2:
      return fn(uint16_t{});
    default:
      return fn(uint8_t{});
  }
}

// Run fn with the index type of a grid-stride loop over `count` units: 32 bits where they suffice (cheaper
// division) with room for the last stride (at most kMaxBlocks * kThreads < 2^28) not to wrap.
template <typename Fn>
void by_index(uint64_t count, Fn&& fn) {
  if (count < (uint64_t{1} << 31)) return fn(uint32_t{});
  fn(uint64_t{});
}

// ---- slice and concat: blocks of rows copied between row-major buffers ----

// `rows` rows of `length` units: row r from src[r * src_pitch + src_begin, + length) to
// dst[r * dst_pitch + dst_begin, + length) (the CPU's copy_slice, in units).
struct RowBlocks {
  uint64_t rows, length, src_pitch, src_begin, dst_pitch, dst_begin;
};

template <typename U, typename I>
__global__ void copy_row_blocks(const U* src, U* dst, RowBlocks b) {
  const I total = static_cast<I>(b.rows * b.length), length = static_cast<I>(b.length);
  for (I u = static_cast<I>(first_thread()); u < total; u += static_cast<I>(thread_count())) {
    const I r = u / length, k = u - r * length;
    dst[static_cast<uint64_t>(r) * b.dst_pitch + b.dst_begin + k] =
        src[static_cast<uint64_t>(r) * b.src_pitch + b.src_begin + k];
  }
}

// Elements [outer, src_dim, inner] -> [outer, dst_dim, inner]: `len` of dim from src_start to dst_start.
void copy_slice(const void* src, void* dst, size_t element_bytes, int64_t outer, int64_t src_dim, int64_t dst_dim,
                int64_t src_start, int64_t dst_start, int64_t len, int64_t inner, const LaunchContext& ctx,
                const char* name) {
  if (outer == 0 || len == 0 || inner == 0) return;
  const auto row = static_cast<uint64_t>(inner) * element_bytes;  // bytes of one index of dim
  const uint64_t bytes[] = {static_cast<uint64_t>(len) * row, static_cast<uint64_t>(src_dim) * row,
                            static_cast<uint64_t>(src_start) * row, static_cast<uint64_t>(dst_dim) * row,
                            static_cast<uint64_t>(dst_start) * row};
  const size_t unit = widest_unit({bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], address_of(src), address_of(dst)});
  const RowBlocks b{static_cast<uint64_t>(outer),
                    bytes[0] / unit,
                    bytes[1] / unit,
                    bytes[2] / unit,
                    bytes[3] / unit,
                    bytes[4] / unit};
  by_unit(unit, [&](auto z) {
    using U = decltype(z);
    by_index(b.rows * b.length, [&](auto i) {
      using I = decltype(i);
      copy_row_blocks<U, I>
          <<<blocks_for(static_cast<int64_t>(b.rows * b.length), kThreads), kThreads, 0, stream_of(ctx)>>>(
              static_cast<const U*>(src), static_cast<U*>(dst), b);
      check_launch(name);
    });
  });
}

// slice_backward's output, [rows, pitch] units: row r's units [begin, begin + length) from src (packed rows of
// `length` units), the rest zero.
template <typename U, typename I>
__global__ void pad_row_blocks(const U* src, U* dst, uint64_t rows, uint64_t pitch, uint64_t begin, uint64_t length) {
  const I total = static_cast<I>(rows * pitch), row_units = static_cast<I>(pitch);
  for (I u = static_cast<I>(first_thread()); u < total; u += static_cast<I>(thread_count())) {
    const I r = u / row_units, k = u - r * row_units;
    U value{};
    if (k >= begin && k < begin + length) value = src[static_cast<uint64_t>(r) * length + (k - begin)];
    dst[u] = value;
  }
}

void slice(const KernelArgs& a, const LaunchContext& ctx) {
  const AroundDim s = around_dim(a.in[0]->shape(), static_cast<size_t>(a.attrs.get(attr::dim)));
  const int64_t length = a.attrs.get(attr::length), start = a.attrs.get(attr::start);
  copy_slice(a.in[0]->raw(), a.out[0]->raw(), dtype_size(a.in[0]->dtype()), s.outer, s.dim, length, start, 0, length,
             s.inner, ctx, "slice");
}

// The CPU zeroes the output, then copies the gradient's [outer, dim, inner] to dim's [start, start + dim) of
// [outer, full_size, inner]; here every output unit is written once.
void slice_backward(const KernelArgs& a, const LaunchContext& ctx) {
  const AroundDim s = around_dim(a.in[0]->shape(), static_cast<size_t>(a.attrs.get(attr::dim)));
  const int64_t full_size = a.attrs.get(attr::full_size), start = a.attrs.get(attr::start);
  MT_CHECK(start >= 0 && start + s.dim <= full_size, "slice_backward: [{}, {}) is outside [0, {})", start,
           start + s.dim, full_size);
  if (a.out[0]->numel() == 0) return;
  const uint64_t row = static_cast<uint64_t>(s.inner) * dtype_size(a.in[0]->dtype());
  const uint64_t pitch = static_cast<uint64_t>(full_size) * row, begin = static_cast<uint64_t>(start) * row,
                 length = static_cast<uint64_t>(s.dim) * row;
  const size_t unit = widest_unit({pitch, begin, length, address_of(a.in[0]->raw()), address_of(a.out[0]->raw())});
  const auto rows = static_cast<uint64_t>(s.outer);
  by_unit(unit, [&](auto z) {
    using U = decltype(z);
    by_index(rows * (pitch / unit), [&](auto i) {
      using I = decltype(i);
      pad_row_blocks<U, I>
          <<<blocks_for(static_cast<int64_t>(rows * (pitch / unit)), kThreads), kThreads, 0, stream_of(ctx)>>>(
              in_ptr<U>(a, 0), out_ptr<U>(a), rows, pitch / unit, begin / unit, length / unit);
      check_launch("slice_backward");
    });
  });
}

void concat(const KernelArgs& a, const LaunchContext& ctx) {
  const auto d = static_cast<size_t>(a.attrs.get(attr::dim));
  const AroundDim o = around_dim(a.out[0]->shape(), d);
  const size_t element_bytes = dtype_size(a.out[0]->dtype());
  int64_t start = 0;
  for (const Tensor* x : a.in) {
    MT_CHECK(x->dtype() == a.out[0]->dtype(), "concat: input of dtype {} into an output of dtype {}",
             dtype_name(x->dtype()), dtype_name(a.out[0]->dtype()));
    const AroundDim s = around_dim(x->shape(), d);
    copy_slice(x->raw(), a.out[0]->raw(), element_bytes, s.outer, s.dim, o.dim, 0, start, s.dim, s.inner, ctx,
               "concat");
    start += s.dim;
  }
}

// ---- transpose: [A, P, M, Q, C] -> [A, Q, M, P, C], C units contiguous ----

struct TransposeDims {
  uint64_t a, p, m, q, c;
};

// One thread per output unit, reading runs of C units.
template <typename U, typename I>
__global__ void transpose_runs(const U* in, U* out, TransposeDims d) {
  const I total = static_cast<I>(d.a * d.q * d.m * d.p * d.c);
  const I c_n = static_cast<I>(d.c), p_n = static_cast<I>(d.p), m_n = static_cast<I>(d.m), q_n = static_cast<I>(d.q);
  for (I o = static_cast<I>(first_thread()); o < total; o += static_cast<I>(thread_count())) {
    I t = o / c_n;
    const I c = o - t * c_n;
    const I p = t % p_n;
    t /= p_n;
    const I m = t % m_n;
    t /= m_n;
    const I q = t % q_n;
    const I a = t / q_n;
    out[o] = in[(((a * p_n + p) * m_n + m) * q_n + q) * c_n + c];
  }
}

// C == 1: tiles of kTile x kTile through shared memory, so that reads run along Q and writes along P.
template <typename U>
__global__ void transpose_tiles(const U* in, U* out, TransposeDims d, uint64_t tiles_p, uint64_t tiles_q) {
  __shared__ U tile[kTile][kTile + 1];
  const uint64_t tiles = d.a * d.m * tiles_p * tiles_q;
  for (uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const uint64_t tq = t % tiles_q, rest = t / tiles_q;
    const uint64_t tp = rest % tiles_p, batch = rest / tiles_p;
    const uint64_t a = batch / d.m, m = batch % d.m;
    const uint64_t p0 = tp * kTile, q0 = tq * kTile;
    for (int y = threadIdx.y; y < kTile; y += kTileRows) {
      const uint64_t p = p0 + y, q = q0 + threadIdx.x;
      if (p < d.p && q < d.q) tile[y][threadIdx.x] = in[((a * d.p + p) * d.m + m) * d.q + q];
    }
    __syncthreads();
    for (int y = threadIdx.y; y < kTile; y += kTileRows) {
      const uint64_t q = q0 + y, p = p0 + threadIdx.x;
      if (p < d.p && q < d.q) out[((a * d.q + q) * d.m + m) * d.p + p] = tile[threadIdx.x][y];
    }
    __syncthreads();  // the tile is read before the next one is loaded
  }
}

void transpose(const KernelArgs& a, const LaunchContext& ctx) {
  const auto& dims = a.in[0]->shape().dims();
  const auto rank = static_cast<int64_t>(dims.size());
  int64_t d0 = a.attrs.get(attr::dim0), d1 = a.attrs.get(attr::dim1);
  MT_CHECK(d0 >= 0 && d0 < rank && d1 >= 0 && d1 < rank, "transpose: dims {} and {} out of range for rank {}", d0, d1,
           rank);
  if (d0 > d1) std::swap(d0, d1);  // swapping two dims is symmetric
  const int64_t numel = a.in[0]->numel();
  if (numel == 0) return;
  const size_t element_bytes = dtype_size(a.in[0]->dtype());
  if (d0 == d1 || dims[d0] == 1 || dims[d1] == 1) {  // the same order of elements: a copy
    check_cuda(cudaMemcpyAsync(a.out[0]->raw(), a.in[0]->raw(), static_cast<size_t>(numel) * element_bytes,
                               cudaMemcpyDeviceToDevice, stream_of(ctx)),
               "transpose");
    return;
  }
  TransposeDims d{1, static_cast<uint64_t>(dims[d0]), 1, static_cast<uint64_t>(dims[d1]), 1};
  for (int64_t k = 0; k < d0; ++k) d.a *= static_cast<uint64_t>(dims[k]);
  for (int64_t k = d0 + 1; k < d1; ++k) d.m *= static_cast<uint64_t>(dims[k]);
  for (int64_t k = d1 + 1; k < rank; ++k) d.c *= static_cast<uint64_t>(dims[k]);
  const uint64_t run_bytes = d.c * element_bytes;
  const size_t unit = widest_unit({run_bytes, address_of(a.in[0]->raw()), address_of(a.out[0]->raw())});
  d.c = run_bytes / unit;
  by_unit(unit, [&](auto z) {
    using U = decltype(z);
    if (d.c == 1) {
      const uint64_t tiles_p = (d.p + kTile - 1) / kTile, tiles_q = (d.q + kTile - 1) / kTile;
      const uint64_t tiles = d.a * d.m * tiles_p * tiles_q;
      const auto blocks = static_cast<unsigned>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
      transpose_tiles<U>
          <<<blocks, dim3(kTile, kTileRows), 0, stream_of(ctx)>>>(in_ptr<U>(a, 0), out_ptr<U>(a), d, tiles_p, tiles_q);
      check_launch("transpose");
      return;
    }
    const uint64_t total = d.a * d.q * d.m * d.p * d.c;
    by_index(total, [&](auto i) {
      using I = decltype(i);
      transpose_runs<U, I><<<blocks_for(static_cast<int64_t>(total), kThreads), kThreads, 0, stream_of(ctx)>>>(
          in_ptr<U>(a, 0), out_ptr<U>(a), d);
      check_launch("transpose");
    });
  });
}

}  // namespace

void add_shape_kernels(const AddKernel& add) {
  add("transpose", transpose);
  add("slice", slice);
  add("slice_backward", slice_backward);
  add("concat", concat);
}

}  // namespace meshtrain::kernels::cuda::ops
