// CPU kernels of the bucket ops (graph/ops/collective.cpp): byte copies
// between the members and the flat bucket, piece c of every member
// together; a member the memory plan laid out in the bucket already (a view
// of it) is not copied. The collectives themselves run on the mesh groups,
// not here.
#include <cstring>

#include "graph/ops/collective.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

namespace {

// Calls copy(member, byte offset in the member, byte offset in the bucket, bytes) for each piece.
template <typename Copy>
void for_each_piece(const std::vector<size_t>& member_bytes, int64_t chunks, Copy&& copy) {
  const auto k = static_cast<size_t>(chunks);
  size_t at = 0;
  for (size_t c = 0; c < k; ++c)
    for (size_t m = 0; m < member_bytes.size(); ++m) {
      const size_t piece = member_bytes[m] / k;
      copy(m, c * piece, at, piece);
      at += piece;
    }
}

}  // namespace

void add_collective_kernels(const AddKernel& add) {
  add("bucket_pack", [](const KernelArgs& a) {
    std::vector<size_t> bytes;
    for (const Tensor* m : a.in) bytes.push_back(m->nbytes());
    auto* bucket = static_cast<std::byte*>(a.out[0]->raw());
    for_each_piece(bytes, a.attrs.get(attr::chunks), [&](size_t m, size_t from, size_t to, size_t n) {
      const auto* piece = static_cast<const std::byte*>(a.in[m]->raw()) + from;
      if (piece != bucket + to) std::memcpy(bucket + to, piece, n);
    });
  });
  add("bucket_unpack", [](const KernelArgs& a) {
    std::vector<size_t> bytes;
    for (const Tensor* m : a.out) bytes.push_back(m->nbytes());
    const auto* bucket = static_cast<const std::byte*>(a.in[0]->raw());
    for_each_piece(bytes, a.attrs.get(attr::chunks), [&](size_t m, size_t to, size_t from, size_t n) {
      auto* piece = static_cast<std::byte*>(a.out[m]->raw()) + to;
      if (piece != bucket + from) std::memcpy(piece, bucket + from, n);
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
