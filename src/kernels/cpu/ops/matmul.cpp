// CPU kernels of matmul and rows_matmul (graph/ops/matmul.cpp): OpenBLAS for f32 and f64, oneDNN for bf16;
// fp8_matmul and fp8_rows_matmul: the operands quantised onto their FP8 grids, then an f32 GEMM (exact for
// them: what an FP8 tensor core accumulating in f32 computes).
#include "graph/ops/matmul.h"

#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "core/fp8.h"
#include "kernels/cpu/bf16_matmul.h"
#include "kernels/cpu/kernel_support.h"
#include "kernels/cpu/ops/families.h"

namespace meshtrain::kernels::cpu::ops {

namespace {

// An FP8 operand as the GEMM multiplies it: each element times the scale of
// the tensor's amax, rounded onto the format's grid (in f32, exactly), and
// the inverse scale the product is taken back by.
struct Fp8Grid {
  std::vector<float> values;
  float inverse_scale;
};

std::mutex nonfinite_mutex;
std::string first_nonfinite;  // guarded by nonfinite_mutex

// The scale of an amax; nullopt when the tensor held a NaN or infinity
// (graph/ops/reduction.cpp: its amax is then +inf), noted by its name
// (`what`) for take_fp8_nonfinite_operand.
std::optional<float> scale_of(const KernelArgs& a, const Tensor& amax, DType format, const std::string& what) {
  const double largest = amax.get(0);
  if (std::isfinite(largest)) return fp8_scale(format, largest, a.attrs.get(attr::pow2_scale));
  std::lock_guard lock(nonfinite_mutex);
  if (first_nonfinite.empty()) first_nonfinite = what;
  return std::nullopt;
}

// Every element of the node's output NaN (an operand had no scale).
void fill_nan(const KernelArgs& a) {
  Tensor& out = *a.out[0];
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, std::numeric_limits<double>::quiet_NaN());
}

// An operand quantised ahead (fp8_quantize) is on its grid already.
Fp8Grid fp8_grid(const Tensor& t, float scale, DType format) {
  const int64_t n = t.numel();
  Fp8Grid grid{std::vector<float>(static_cast<size_t>(n)), 1.0f / scale};
  float* out = grid.values.data();
  if (t.dtype() == format) {
    float widened[256];
    for (int bits = 0; bits < 256; ++bits) widened[bits] = fp8_widen(static_cast<uint8_t>(bits), format);
    const auto* x = static_cast<const uint8_t*>(t.raw());
#pragma omp parallel for if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) out[i] = widened[x[i]];
    return grid;
  }
  by_float_type(t.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* x = static_cast<const T*>(t.raw());
#pragma omp parallel for if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) out[i] = fp8_round(static_cast<float>(load(x[i])) * scale, format);
  });
  return grid;
}

// Both operands on their grids, `gemm(a, b, c)` into f32 sums, then each sum
// times both inverse scales, stored in the output's dtype.
template <typename Gemm>
void fp8_gemm(const KernelArgs& a, Gemm&& gemm) {
  const std::string& layer = a.attrs.get(attr::tensor);
  const DType format_a = a.attrs.get(attr::format_a), format_b = a.attrs.get(attr::format_b);
  const std::optional<float> scale_a = scale_of(a, *a.in[2], format_a, layer + " " + a.attrs.get(attr::operand_a));
  const std::optional<float> scale_b = scale_of(a, *a.in[3], format_b, layer + " " + a.attrs.get(attr::operand_b));
  if (!scale_a || !scale_b) return fill_nan(a);
  const Fp8Grid x = fp8_grid(*a.in[0], *scale_a, format_a), y = fp8_grid(*a.in[1], *scale_b, format_b);
  Tensor& out = *a.out[0];
  const int64_t n = out.numel();
  const bool f32 = out.dtype() == DType::f32;
  std::vector<float> sums(f32 ? 0 : static_cast<size_t>(n));
  float* c = f32 ? static_cast<float*>(out.raw()) : sums.data();
  gemm(x.values.data(), y.values.data(), c);
  const float alpha = x.inverse_scale * y.inverse_scale;
  if (f32) {
#pragma omp parallel for if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) c[i] *= alpha;
    return;
  }
  auto* o = static_cast<bfloat16*>(out.raw());  // fp8_matmul's operands are f32 or bf16 (its shape rule)
#pragma omp parallel for if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(c[i] * alpha);
}

}  // namespace

void add_matmul_kernels(const AddKernel& add) {
  add("matmul", [](const KernelArgs& a) {
    const bool ta = a.attrs.get(attr::transpose_a), tb = a.attrs.get(attr::transpose_b);
    const graph::ops::MatmulDims d = graph::ops::matmul_dims(a.in[0]->shape(), a.in[1]->shape(), ta, tb);
    const int64_t b_stride = d.b_shared ? 0 : d.k * d.n;
    if (d.k == 0) {  // an empty sum (a shard of no rows of the contracted dim): zeros, which a GEMM need not write
      std::memset(a.out[0]->raw(), 0, a.out[0]->nbytes());
      return;
    }
    switch (a.in[0]->dtype()) {
      case DType::bf16:
        return matmul_bf16(in_ptr<bfloat16>(a, 0), in_ptr<bfloat16>(a, 1), out_ptr<bfloat16>(a), d.batch, d.m, d.n, d.k,
                           ta, tb, d.m * d.k, b_stride);
      case DType::f32:
        return matmul(in_ptr<float>(a, 0), in_ptr<float>(a, 1), out_ptr<float>(a), d.batch, d.m, d.n, d.k, ta, tb,
                      d.m * d.k, b_stride);
      case DType::f64:
        return matmul(in_ptr<double>(a, 0), in_ptr<double>(a, 1), out_ptr<double>(a), d.batch, d.m, d.n, d.k, ta, tb,
                      d.m * d.k, b_stride);
      default:
        // matmul's shape rule admits f32, f64 and bf16 only (check_float), A and B alike.
        MT_ASSERT(false, "no CPU GEMM for dtype {}", dtype_name(a.in[0]->dtype()));
    }
  });
  add("rows_matmul", [](const KernelArgs& a) {  // x^T y over every row: one GEMM with transpose_a
    const int64_t p = a.in[0]->shape().dim(-1), q = a.in[1]->shape().dim(-1);
    const int64_t rows = p > 0 ? a.in[0]->numel() / p : 0;
    if (rows == 0) {  // an empty shard's sum: zeros (a GEMM over no rows need not write them)
      std::memset(a.out[0]->raw(), 0, a.out[0]->nbytes());
      return;
    }
    switch (a.in[0]->dtype()) {
      case DType::bf16:
        return matmul_bf16(in_ptr<bfloat16>(a, 0), in_ptr<bfloat16>(a, 1), out_ptr<bfloat16>(a), 1, p, q, rows, true,
                           false, 0, 0);
      case DType::f32:
        return matmul(in_ptr<float>(a, 0), in_ptr<float>(a, 1), out_ptr<float>(a), 1, p, q, rows, true, false, 0, 0);
      case DType::f64:
        return matmul(in_ptr<double>(a, 0), in_ptr<double>(a, 1), out_ptr<double>(a), 1, p, q, rows, true, false, 0, 0);
      default:
        MT_ASSERT(false, "no CPU GEMM for dtype {}", dtype_name(a.in[0]->dtype()));
    }
  });
  add("fp8_matmul", [](const KernelArgs& a) {
    const bool ta = a.attrs.get(attr::transpose_a), tb = a.attrs.get(attr::transpose_b);
    const graph::ops::MatmulDims d = graph::ops::matmul_dims(a.in[0]->shape(), a.in[1]->shape(), ta, tb);
    if (d.k == 0) {  // an empty sum: zeros
      std::memset(a.out[0]->raw(), 0, a.out[0]->nbytes());
      return;
    }
    fp8_gemm(a, [&](const float* x, const float* y, float* c) {
      matmul(x, y, c, d.batch, d.m, d.n, d.k, ta, tb, d.m * d.k, d.b_shared ? 0 : d.k * d.n);
    });
  });
  add("fp8_rows_matmul", [](const KernelArgs& a) {
    const int64_t p = a.in[0]->shape().dim(-1), q = a.in[1]->shape().dim(-1);
    const int64_t rows = p > 0 ? a.in[0]->numel() / p : 0;
    if (rows == 0) {
      std::memset(a.out[0]->raw(), 0, a.out[0]->nbytes());
      return;
    }
    fp8_gemm(a, [&](const float* x, const float* y, float* c) { matmul(x, y, c, 1, p, q, rows, true, false, 0, 0); });
  });
  add("fp8_quantize", [](const KernelArgs& a) {
    const DType format = a.attrs.get(attr::dtype);
    const std::optional<float> scale = scale_of(a, *a.in[1], format, a.attrs.get(attr::tensor));
    if (!scale) {  // every element NaN: 0x7F is NaN in E4M3 and in E5M2
      std::memset(a.out[0]->raw(), 0x7F, a.out[0]->nbytes());
      return;
    }
    const int64_t n = a.in[0]->numel();
    auto* out = out_ptr<uint8_t>(a);
    by_float_type(a.in[0]->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* x = in_ptr<T>(a, 0);
#pragma omp parallel for if (n > kParallelElements)
      for (int64_t i = 0; i < n; ++i) out[i] = fp8_quantize(static_cast<float>(load(x[i])), *scale, format);
    });
  });
}

}  // namespace meshtrain::kernels::cpu::ops

namespace meshtrain::kernels::cpu {

std::string take_fp8_nonfinite_operand() {
  std::lock_guard lock(ops::nonfinite_mutex);
  return std::exchange(ops::first_nonfinite, std::string());
}

}  // namespace meshtrain::kernels::cpu
