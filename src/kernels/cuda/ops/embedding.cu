// CUDA kernels of the embedding ops (graph/ops/embedding.cpp): a gather of table rows by id, and its backward, which
// sorts the positions by id (stable) and sums each table row's positions in order in f32 (deterministic, one
// rounding per element, as the CPU).
#include <bit>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <limits>
#include <type_traits>

#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

constexpr int kThreads = 128;
constexpr size_t kScratchAlign = 256;


// kWidth elements of a row at a time: 16 bytes when kVec, else one element.
template <typename T, bool kVec>
struct RowAccess {
  static constexpr int kWidth = kVec ? static_cast<int>(16 / sizeof(T)) : 1;
  using Chunk = std::conditional_t<kVec, uint4, T>;
  __device__ static Chunk load(const T* row, int64_t i) { return *reinterpret_cast<const Chunk*>(row + i); }
  __device__ static void store(T* row, int64_t i, Chunk c) { *reinterpret_cast<Chunk*>(row + i) = c; }
  __device__ static void add_to(float (&acc)[kWidth], Chunk c) {
    const T* e = reinterpret_cast<const T*>(&c);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) acc[k] += to_f32(e[k]);
  }
  __device__ static Chunk rounded(const float (&v)[kWidth]) {
    Chunk c;
    T* e = reinterpret_cast<T*>(&c);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) e[k] = from_f32<T>(v[k]);
    return c;
  }
  __device__ static Chunk filled(float value) {
    float v[kWidth];
#pragma unroll
    for (int k = 0; k < kWidth; ++k) v[k] = value;
    return rounded(v);
  }
};

// One block per position (grid-stride): out[i] = table[ids[i] - start], zeros for another part's id, NaN for an id
// outside [0, total) (the CPU throws).
template <typename T, bool kVec>
__global__ void embedding_kernel(const T* table, const int64_t* ids, T* out, int64_t n, int64_t rows, int64_t dim,
                                 int64_t start, int64_t total) {
  using Access = RowAccess<T, kVec>;
  constexpr int W = Access::kWidth;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t id = ids[i], row = id - start;
    T* o = out + i * dim;
    if (row >= 0 && row < rows && id >= 0 && id < total) {
      const T* src = table + row * dim;
      for (int64_t j = static_cast<int64_t>(threadIdx.x) * W; j < dim; j += static_cast<int64_t>(blockDim.x) * W)
        Access::store(o, j, Access::load(src, j));
    } else {
      const auto fill = Access::filled(id >= 0 && id < total ? 0.0f : __int_as_float(0x7fc00000));
      for (int64_t j = static_cast<int64_t>(threadIdx.x) * W; j < dim; j += static_cast<int64_t>(blockDim.x) * W)
        Access::store(o, j, fill);
    }
  }
}

// The sort's input: each position's row in this part (rows for another part's id, sorted last) and the position.
__global__ void sort_keys_kernel(const int64_t* ids, int64_t n, int64_t rows, int64_t start, uint32_t* keys,
                                 uint32_t* positions) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = ids[i] - start;
    keys[i] = static_cast<uint32_t>(row >= 0 && row < rows ? row : rows);
    positions[i] = static_cast<uint32_t>(i);
  }
}

// first[r] for r in [0, rows]: the first sorted position whose key is >= r (row r's positions are [first[r],
// first[r + 1])).
__global__ void row_starts_kernel(const uint32_t* sorted_keys, int64_t n, int64_t rows, uint32_t* first) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r <= rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted_keys[mid] < static_cast<uint64_t>(r))
        lo = mid + 1;
      else
        hi = mid;
    }
    first[r] = static_cast<uint32_t>(lo);
  }
}

// Block (r, y): columns of dtable's row r, each the f32 sum of dout's rows at row r's positions in position order,
// rounded once. Writes every element of dtable (rows no position names: zeros).
template <typename T, bool kVec>
__global__ void embedding_backward_kernel(const T* dout, const uint32_t* sorted_positions, const uint32_t* first,
                                          int64_t dim, T* dtable) {
  using Access = RowAccess<T, kVec>;
  constexpr int W = Access::kWidth;
  const int64_t r = blockIdx.x;
  const int64_t j = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * W;
  if (j >= dim) return;
  const uint32_t begin = first[r], end = first[r + 1];
  float acc[W] = {};
#pragma unroll 4
  for (uint32_t p = begin; p < end; ++p) Access::add_to(acc, Access::load(dout + sorted_positions[p] * dim, j));
  Access::store(dtable + r * dim, j, Access::rounded(acc));
}

size_t aligned_bytes(size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// The backward's device scratch: the sort's key and position buffers (two each), the rows' first positions, CUB's
// temporary storage.
struct BackwardScratch {
  cub::DoubleBuffer<uint32_t> keys, positions;
  uint32_t* first = nullptr;
  void* sort_temp = nullptr;
  size_t sort_temp_bytes = 0;
};

BackwardScratch backward_scratch(const LaunchContext& ctx, int64_t n, int64_t rows, int end_bit) {
  BackwardScratch s;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, s.sort_temp_bytes, s.keys, s.positions, static_cast<int>(n), 0,
                                             end_bit, stream_of(ctx)),
             "embedding_backward: sizing the sort");
  const size_t buffer = aligned_bytes(static_cast<size_t>(n) * sizeof(uint32_t));
  const size_t firsts = aligned_bytes(static_cast<size_t>(rows + 1) * sizeof(uint32_t));
  char* base = scratch_of<char>(ctx, 4 * buffer + firsts + s.sort_temp_bytes, "embedding_backward");
  auto* words = reinterpret_cast<uint32_t*>(base);
  const size_t words_per_buffer = buffer / sizeof(uint32_t);
  s.keys = cub::DoubleBuffer<uint32_t>(words, words + words_per_buffer);
  s.positions = cub::DoubleBuffer<uint32_t>(words + 2 * words_per_buffer, words + 3 * words_per_buffer);
  s.first = reinterpret_cast<uint32_t*>(base + 4 * buffer);
  s.sort_temp = base + 4 * buffer + firsts;
  return s;
}

// ids (i64, n) and dout [n, dim] -> dtable [rows, dim] of the part starting at row `start`.
template <typename T>
void launch_embedding_backward(const int64_t* ids, const T* dout, T* dtable, int64_t n, int64_t rows, int64_t dim,
                               int64_t start, const LaunchContext& ctx) {
  constexpr const char* kOp = "embedding_backward";
  MT_CHECK(n < std::numeric_limits<int32_t>::max() && rows < std::numeric_limits<int32_t>::max(),
           "{}: {} positions of a table of {} rows are more than the CUDA kernel indexes", kOp, n, rows);
  const cudaStream_t stream = stream_of(ctx);
  const int end_bit = std::bit_width(static_cast<uint64_t>(rows));  // the keys are <= rows
  BackwardScratch s = backward_scratch(ctx, n, rows, end_bit);
  if (n > 0) {
    sort_keys_kernel<<<blocks_for(n), 256, 0, stream>>>(ids, n, rows, start, s.keys.Current(), s.positions.Current());
    check_launch(kOp);
    check_cuda(cub::DeviceRadixSort::SortPairs(s.sort_temp, s.sort_temp_bytes, s.keys, s.positions, static_cast<int>(n),
                                               0, end_bit, stream),
               kOp);
  }
  row_starts_kernel<<<blocks_for(rows + 1), 256, 0, stream>>>(s.keys.Current(), n, rows, s.first);
  check_launch(kOp);
  with_row_access<T>(dim, {dout, dtable}, [&](auto vec) {
    constexpr bool kVec = decltype(vec)::value;
    const int64_t columns_per_block = static_cast<int64_t>(kThreads) * RowAccess<T, kVec>::kWidth;
    const int64_t column_blocks = (dim + columns_per_block - 1) / columns_per_block;
    MT_CHECK(column_blocks <= 65535, "{}: rows of {} elements are more than the CUDA kernel handles", kOp, dim);
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(column_blocks));
    embedding_backward_kernel<T, kVec>
        <<<grid, kThreads, 0, stream>>>(dout, s.positions.Current(), s.first, dim, dtable);
    check_launch(kOp);
  });
}

}  // namespace

void add_embedding_kernels(const AddKernel& add) {
  add("embedding", [](const KernelArgs& a, const LaunchContext& ctx) {
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const int64_t rows = a.in[0]->shape().dim(0), dim = a.in[0]->shape().dim(1), n = a.in[1]->numel();
      const TablePart part = table_part(a, rows);
      if (n == 0 || dim == 0) return;
      with_row_access<T>(dim, {a.in[0]->raw(), a.out[0]->raw()}, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        embedding_kernel<T, kVec><<<blocks_for(n, 1), kThreads, 0, stream_of(ctx)>>>(
            in_ptr<T>(a, 0), in_ptr<int64_t>(a, 1), out_ptr<T>(a), n, rows, dim, part.start, part.total);
        check_launch("embedding");
      });
    });
  });
  add("embedding_backward", [](const KernelArgs& a, const LaunchContext& ctx) {  // ids, dout -> dtable
    by_float_type(a.in[1]->dtype(), [&](auto z) {
      using T = decltype(z);
      const int64_t rows = a.out[0]->shape().dim(0), dim = a.out[0]->shape().dim(1);
      if (rows == 0 || dim == 0) return;
      launch_embedding_backward(in_ptr<int64_t>(a, 0), in_ptr<T>(a, 1), out_ptr<T>(a), a.in[0]->numel(), rows, dim,
                                table_part(a, 0).start, ctx);
    });
  });
}

}  // namespace meshtrain::kernels::cuda::ops
