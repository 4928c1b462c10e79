// CPU kernels of the optimizer ops (graph/ops/optimizer.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/copy.h"
#include "graph/op_registry.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

void add_optimizer_kernels(const AddKernel& add) {
  add("clip_coefficient", [](const KernelArgs& a) {
    // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to at most 1.
    a.out[0]->set(0, std::min(1.0, a.attrs.get(attr::max_norm) / (a.in[0]->get(0) + 1e-6)));
  });
  add("adamw", [](const KernelArgs& a) {
    const int64_t step = static_cast<const int64_t*>(a.in[5]->raw())[0];
    MT_CHECK(step >= 1, "adamw: step must be >= 1 (bias correction), got {}", step);
    // The graph is functional: the update goes into the outputs (param, m,
    // v), which the memory plan may have put over the inputs they update
    // (the op's in_place pairs); the others start as copies of their inputs.
    static const std::vector<graph::OpDef::InPlace>& updated = graph::find_op("adamw").in_place;
    for (const auto [out, in] : updated)
      if (a.out[out]->raw() != a.in[in]->raw()) copy_bytes(a.out[out]->raw(), a.in[in]->raw(), a.in[in]->nbytes());
    if (a.in.size() == 7 && !std::isfinite(a.in[6]->get(0))) return;  // a non-finite step: nothing changes
    const double lr = static_cast<const double*>(a.in[4]->raw())[0];
    auto run = [&](auto param_type, auto state_type) {
      using T = decltype(param_type);
      using S = decltype(state_type);
      adamw(out_ptr<T>(a, 0), in_ptr<T>(a, 1), out_ptr<S>(a, 1), out_ptr<S>(a, 2), a.in[0]->numel(), lr,
            a.attrs.get(attr::beta1), a.attrs.get(attr::beta2), a.attrs.get(attr::eps), a.attrs.get(attr::weight_decay),
            step);
    };
    if (a.in[0]->dtype() == DType::f32 && a.in[2]->dtype() == DType::bf16) return run(float{}, bfloat16{});
    by_float_type(a.in[0]->dtype(), [&](auto z) { run(z, z); });
  });
}

}  // namespace meshtrain::kernels::cpu::ops
