// CPU kernels of the bucket ops (graph/ops/collective.cpp): byte copies
// (copy_bytes) between the members and the flat bucket, one member after another; a
// member the memory plan laid out in the bucket already (a view of it) is
// not copied. The collectives themselves run on the mesh groups,
// not here.
#include "graph/ops/collective.h"

#include "core/copy.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_collective_kernels(const AddKernel& add) {
  add("bucket_pack", [](const KernelArgs& a) {
    auto* at = static_cast<std::byte*>(a.out[0]->raw());
    for (const Tensor* m : a.in) {
      if (m->raw() != at) copy_bytes(at, m->raw(), m->nbytes());
      at += m->nbytes();
    }
  });
  add("bucket_unpack", [](const KernelArgs& a) {
    const auto* at = static_cast<const std::byte*>(a.in[0]->raw());
    for (Tensor* m : a.out) {
      if (m->raw() != at) copy_bytes(m->raw(), at, m->nbytes());
      at += m->nbytes();
    }
  });
}

}  // namespace meshtrain::kernels::cpu::ops
