#include "kernels/cpu/bf16_matmul.h"

#include <dnnl.hpp>

#include <map>
#include <mutex>
#include <tuple>

namespace meshtrain::kernels::cpu {

namespace {

using dnnl::memory;

struct Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mu;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool>, dnnl::matmul> primitives;
};

Dnnl& dnnl_state() {
  static Dnnl* state = new Dnnl();  // lives until exit: primitives may be used by static destructors' callers
  return *state;
}

// The logical [batch, rows, cols] view of a stored matrix, through strides.
memory::desc view(int64_t batch, int64_t rows, int64_t cols, bool transposed, int64_t batch_stride) {
  const memory::dims dims{batch, rows, cols};
  // One matrix: its batch stride is irrelevant, but a 0 there makes oneDNN
  // fall back to its reference kernel (~1000x slower).
  if (batch == 1) batch_stride = rows * cols;
  const memory::dims strides = transposed ? memory::dims{batch_stride, 1, rows} : memory::dims{batch_stride, cols, 1};
  return {dims, memory::data_type::bf16, strides};
}

}  // namespace

void matmul_bf16(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t batch, int64_t m, int64_t n, int64_t k,
                 bool ta, bool tb, int64_t a_stride, int64_t b_stride) {
  Dnnl& d = dnnl_state();
  const bool shared_b = b_stride == 0;
  const memory::desc a_md = view(batch, m, k, ta, a_stride);
  const memory::desc b_md = view(shared_b ? 1 : batch, k, n, tb, shared_b ? k * n : b_stride);
  const memory::desc c_md = view(batch, m, n, false, m * n);
  dnnl::matmul* prim;
  {
    std::lock_guard lock(d.mu);
    const auto key = std::make_tuple(batch, m, n, k, ta, tb, shared_b);
    auto it = d.primitives.find(key);
    if (it == d.primitives.end()) {
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), d.engine);
      it = d.primitives.emplace(key, dnnl::matmul(pd)).first;
    }
    prim = &it->second;
  }
  memory A(a_md, d.engine, const_cast<bfloat16*>(a)), B(b_md, d.engine, const_cast<bfloat16*>(b)), C(c_md, d.engine, c);
  prim->execute(d.stream, {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, C}});
  d.stream.wait();
}

}  // namespace meshtrain::kernels::cpu
