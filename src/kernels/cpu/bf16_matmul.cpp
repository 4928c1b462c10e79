#include "kernels/cpu/bf16_matmul.h"

#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "kernels/cpu/kernel_support.h"

namespace meshtrain::kernels::cpu {

namespace {

using dnnl::memory;

struct Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mu;
  // Per shape: the primitive, or none where oneDNN has no bf16 kernel for
  // this CPU (it needs AVX-512; an AVX2-only CPU has none, not even the
  // reference one).
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool>, std::optional<dnnl::matmul>> primitives;
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
      std::optional<dnnl::matmul> made;
      try {
        made.emplace(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), d.engine));
      } catch (const dnnl::error& e) {
        if (e.status != dnnl_unimplemented) throw;
      }
      it = d.primitives.emplace(key, std::move(made)).first;
    }
    prim = it->second ? &*it->second : nullptr;
  }
  if (!prim) return matmul_bf16_widened(a, b, c, batch, m, n, k, ta, tb, a_stride, b_stride);
  memory A(a_md, d.engine, const_cast<bfloat16*>(a)), B(b_md, d.engine, const_cast<bfloat16*>(b)), C(c_md, d.engine, c);
  // One at a time: the stream, and the scratchpad oneDNN keeps for the
  // primitives (Debian's build does not run one primitive concurrently),
  // are shared by every thread that calls here, such as the ranks of the
  // local backend in one process. An MPI rank's calls never contend.
  std::lock_guard lock(d.mu);
  prim->execute(d.stream, {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, C}});
  d.stream.wait();
}

void matmul_bf16_widened(const bfloat16* a, const bfloat16* b, bfloat16* c, int64_t batch, int64_t m, int64_t n,
                         int64_t k, bool ta, bool tb, int64_t a_stride, int64_t b_stride) {
  thread_local std::vector<float> wa, wb, wc;
  wa.resize(static_cast<size_t>(m * k));
  wb.resize(static_cast<size_t>(k * n));
  wc.resize(static_cast<size_t>(m * n));
  auto widen = [](const bfloat16* from, std::vector<float>& to) {
    for (size_t i = 0; i < to.size(); ++i) to[i] = bf16_to_f32(from[i]);
  };
  for (int64_t i = 0; i < batch; ++i) {
    widen(a + i * a_stride, wa);
    if (i == 0 || b_stride != 0) widen(b + i * b_stride, wb);
    gemm(ta, tb, m, n, k, wa.data(), wb.data(), wc.data(), false);
    bfloat16* out = c + i * m * n;
    for (size_t j = 0; j < wc.size(); ++j) out[j] = f32_to_bf16(wc[j]);
  }
}

}  // namespace meshtrain::kernels::cpu
