// CUDA kernels of the bucket ops (graph/ops/collective.cpp): byte copies between the members and the flat
// bucket, one member after another, batched into few launches; a member the memory plan laid out in the bucket
// already (a view of it) is not copied. The collectives themselves run on the mesh groups, not here.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxCopies = 128;          // copies per launch: the batch travels as a kernel parameter (< 4 KiB)
constexpr int kMaxBlocksPerCopy = 1024;  // grid-stride beyond that
constexpr uint64_t kBytesPerBlock = uint64_t{kThreads} * 16 * 4;  // four 16-byte units per thread

struct Copy {
  const void* src;
  void* dst;
  uint64_t bytes;
};

struct CopyBatch {
  int count;
  Copy copies[kMaxCopies];
};

template <typename U>
__device__ void copy_units(const void* src, void* dst, uint64_t bytes) {
  const auto* s = static_cast<const U*>(src);
  auto* d = static_cast<U*>(dst);
  const uint64_t units = bytes / sizeof(U);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) d[u] = s[u];
}

// Copy blockIdx.y of the batch, in the widest units that its addresses and size allow.
__global__ void copy_batch(const __grid_constant__ CopyBatch batch) {
  const Copy& c = batch.copies[blockIdx.y];
  const uint64_t bits = reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst) | c.bytes;
  if (bits % 16 == 0)
    copy_units<uint4>(c.src, c.dst, c.bytes);
  else if (bits % 8 == 0)
    copy_units<uint2>(c.src, c.dst, c.bytes);
  else if (bits % 4 == 0)
    copy_units<uint32_t>(c.src, c.dst, c.bytes);
  else if (bits % 2 == 0)
    copy_units<uint16_t>(c.src, c.dst, c.bytes);
  else
    copy_units<uint8_t>(c.src, c.dst, c.bytes);
}

// Launches the copies, kMaxCopies at a time.
void run_copies(const std::vector<Copy>& copies, const LaunchContext& ctx, const char* name) {
  for (size_t first = 0; first < copies.size(); first += kMaxCopies) {
    CopyBatch batch{};
    uint64_t largest = 0;
    for (size_t i = first; i < copies.size() && batch.count < kMaxCopies; ++i) {
      batch.copies[batch.count++] = copies[i];
      largest = copies[i].bytes > largest ? copies[i].bytes : largest;
    }
    const uint64_t blocks = (largest + kBytesPerBlock - 1) / kBytesPerBlock;
    const dim3 grid(static_cast<unsigned>(blocks < 1                   ? 1
                                          : blocks > kMaxBlocksPerCopy ? kMaxBlocksPerCopy
                                                                       : blocks),
                    static_cast<unsigned>(batch.count));
    copy_batch<<<grid, kThreads, 0, stream_of(ctx)>>>(batch);
    check_launch(name);
  }
}

// The copies between the bucket and its members laid one after another from its start (to the bucket when
// `pack`), leaving out members that are views of their place in the bucket.
template <typename Members>
std::vector<Copy> member_copies(std::byte* bucket, size_t bucket_bytes, const Members& members, bool pack,
                                const char* name) {
  std::vector<Copy> copies;
  size_t offset = 0;
  for (const Tensor* m : members) {
    const size_t bytes = m->nbytes();
    MT_CHECK(offset + bytes <= bucket_bytes, "{}: the members' {}+ bytes overflow the bucket's {}", name,
             offset + bytes, bucket_bytes);
    std::byte* at = bucket + offset;
    offset += bytes;
    if (bytes == 0 || m->raw() == at) continue;
    if (pack)
      copies.push_back({m->raw(), at, bytes});
    else
      copies.push_back({at, const_cast<void*>(m->raw()), bytes});
  }
  return copies;
}

void bucket_pack(const KernelArgs& a, const LaunchContext& ctx) {
  auto* bucket = static_cast<std::byte*>(a.out[0]->raw());
  run_copies(member_copies(bucket, a.out[0]->nbytes(), a.in, true, "bucket_pack"), ctx, "bucket_pack");
}

void bucket_unpack(const KernelArgs& a, const LaunchContext& ctx) {
  auto* bucket = static_cast<std::byte*>(const_cast<void*>(a.in[0]->raw()));
  run_copies(member_copies(bucket, a.in[0]->nbytes(), a.out, false, "bucket_unpack"), ctx, "bucket_unpack");
}

}  // namespace

void add_collective_kernels(const AddKernel& add) {
  add("bucket_pack", bucket_pack);
  add("bucket_unpack", bucket_unpack);
}

}  // namespace meshtrain::kernels::cuda::ops
