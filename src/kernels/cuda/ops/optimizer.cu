// CUDA kernels of the optimizer ops (graph/ops/optimizer.cpp): the clipping coefficient and the fused AdamW update.
#include <cstdint>

#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

constexpr int kThreads = 256;
constexpr int kPack = 4;  // elements per vector load of the AdamW kernel

// ---- clip_coefficient ----

// torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)) in double.
// std::min(1.0, q) is (q < 1.0 ? q : 1.0): a NaN norm gives 1, an infinite one 0.
template <typename T>
__global__ void clip_coefficient_kernel(const T* norm, T* coef, double max_norm) {
  const double q = max_norm / (to_f64(norm[0]) + 1e-6);
  coef[0] = from_f64<T>(q < 1.0 ? q : 1.0);
}

// by_float_type plus f64 (the norm is one element; the CPU takes any float dtype).
template <typename Fn>
void by_scalar_type(DType t, Fn&& fn) {
  if (t == DType::f64) return fn(double{});
  by_float_type(t, fn);
}

void clip_coefficient(const KernelArgs& a, const LaunchContext& ctx) {
  const double max_norm = a.attrs.get(attr::max_norm);
  by_scalar_type(a.in[0]->dtype(), [&](auto z) {
    using T = decltype(z);
    clip_coefficient_kernel<T><<<1, 1, 0, stream_of(ctx)>>>(in_ptr<T>(a, 0), out_ptr<T>(a, 0), max_norm);
    check_launch("clip_coefficient");
  });
}

// ---- adamw ----

// Whether the one element at p, of floating dtype t, is finite: from its
// bits, as the CPU's std::isfinite(Tensor::get(0)) (e4m3 has no infinity;
// its only non-finite value is NaN, S.1111.111).
__device__ bool first_is_finite(const void* p, DType t) {
  switch (t) {
    case DType::f32:
      return isfinite(*static_cast<const float*>(p));
    case DType::f64:
      return isfinite(*static_cast<const double*>(p));
    case DType::bf16:
      return (*static_cast<const uint16_t*>(p) & 0x7F80u) != 0x7F80u;
    case DType::f16:
      return (*static_cast<const uint16_t*>(p) & 0x7C00u) != 0x7C00u;
    case DType::f8e4m3:
      return (*static_cast<const uint8_t*>(p) & 0x7Fu) != 0x7Fu;
    case DType::f8e5m2:
      return (*static_cast<const uint8_t*>(p) & 0x7Cu) != 0x7Cu;
    default:
      return true;  // integers (the op's infer rules them out) are always finite
  }
}

// The arrays of one AdamW update: out_param, out_m and out_v may be the
// storage of param, m and v (updated in place), so each element is read
// before it is written, and nothing else is read at its index afterwards.
template <typename T, typename S>
struct AdamwArrays {
  const T* param;
  const T* grad;
  const S* m;
  const S* v;
  T* out_param;
  S* out_m;
  S* out_v;
  int64_t n;
  int64_t packs;  // whole packs of kPack elements handled with vector loads (0: none, the pointers are unaligned)
};

// The step's device scalars and the attrs.
struct AdamwScalars {
  const double* lr;
  const int64_t* step;
  const void* apply_if_finite;  // nullptr: always apply
  DType apply_if_finite_dtype;
  double beta1, beta2, weight_decay;  // for the per-step constants, in double as the CPU
  float beta1_f, beta2_f, eps_f;      // the element math's, in f32 as the CPU
};

// Per-step constants, computed once per block as the CPU computes them once
// per call: in double, then rounded to f32. A step < 1 (which the CPU
// rejects on the host) makes step_size or bias2_sqrt inf / 0 / NaN, so the
// updated parameters come out NaN rather than silently wrong.
struct StepConstants {
  float decay, step_size, bias2_sqrt;
  bool apply;
};

__device__ StepConstants step_constants(const AdamwScalars& s) {
  StepConstants c;
  c.apply = s.apply_if_finite == nullptr || first_is_finite(s.apply_if_finite, s.apply_if_finite_dtype);
  const double lr = *s.lr;
  const double step = static_cast<double>(*s.step);
  c.decay = static_cast<float>(1.0 - lr * s.weight_decay);  // decoupled weight decay
  c.step_size = static_cast<float>(lr / (1.0 - pow(s.beta1, step)));
  c.bias2_sqrt = static_cast<float>(sqrt(1.0 - pow(s.beta2, step)));
  return c;
}

// One element's update in f32, the CPU's cpu::adamw line by line: p, m, v in, updated in place.
__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const StepConstants& c,
                                             const AdamwScalars& s) {
  p = p * c.decay;
  const float mi = s.beta1_f * m + (1.0f - s.beta1_f) * g;
  const float vi = s.beta2_f * v + (1.0f - s.beta2_f) * g * g;
  p -= c.step_size * mi / (sqrtf(vi) / c.bias2_sqrt + s.eps_f);
  m = mi;
  v = vi;
}

template <typename T>
struct alignas(sizeof(T) * kPack) Pack {
  T x[kPack];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p, int64_t i) {
  return reinterpret_cast<const Pack<T>*>(p)[i];
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T>& value) {
  reinterpret_cast<Pack<T>*>(p)[i] = value;
}

template <typename T, typename S>
__device__ __forceinline__ void update_pack(const AdamwArrays<T, S>& a, int64_t i, const StepConstants& c,
                                            const AdamwScalars& s) {
  const Pack<T> param = load_pack(a.param, i), grad = load_pack(a.grad, i);
  const Pack<S> m = load_pack(a.m, i), v = load_pack(a.v, i);
  Pack<T> new_param;
  Pack<S> new_m, new_v;
#pragma unroll
  for (int k = 0; k < kPack; ++k) {
    float p = to_f32(param.x[k]), mk = to_f32(m.x[k]), vk = to_f32(v.x[k]);
    adamw_update(p, to_f32(grad.x[k]), mk, vk, c, s);
    new_param.x[k] = from_f32<T>(p);
    new_m.x[k] = from_f32<S>(mk);
    new_v.x[k] = from_f32<S>(vk);
  }
  store_pack(a.out_m, i, new_m);
  store_pack(a.out_v, i, new_v);
  store_pack(a.out_param, i, new_param);
}

template <typename T, typename S>
__device__ __forceinline__ void update_one(const AdamwArrays<T, S>& a, int64_t i, const StepConstants& c,
                                           const AdamwScalars& s) {
  float p = to_f32(a.param[i]), m = to_f32(a.m[i]), v = to_f32(a.v[i]);
  adamw_update(p, to_f32(a.grad[i]), m, v, c, s);
  a.out_m[i] = from_f32<S>(m);
  a.out_v[i] = from_f32<S>(v);
  a.out_param[i] = from_f32<T>(p);
}

// A skipped step: the outputs are copies of the inputs (bit for bit; nothing to do where they are the same storage).
template <typename X>
__device__ void copy_elements(const X* in, X* out, int64_t n, int64_t first, int64_t stride) {
  if (in == out) return;
  for (int64_t i = first; i < n; i += stride) out[i] = in[i];
}

template <typename T, typename S>
__global__ void __launch_bounds__(kThreads) adamw_kernel(AdamwArrays<T, S> a, AdamwScalars s) {
  __shared__ StepConstants shared_constants;
  if (threadIdx.x == 0) shared_constants = step_constants(s);
  __syncthreads();
  const StepConstants c = shared_constants;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (!c.apply) {  // a non-finite gradient norm: nothing changes
    copy_elements(a.param, a.out_param, a.n, first, stride);
    copy_elements(a.m, a.out_m, a.n, first, stride);
    copy_elements(a.v, a.out_v, a.n, first, stride);
    return;
  }
  for (int64_t i = first; i < a.packs; i += stride) update_pack(a, i, c, s);
  for (int64_t i = a.packs * kPack + first; i < a.n; i += stride) update_one(a, i, c, s);
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Enough blocks to fill the GPU once (the grid-stride loop covers the rest), so each block computes the step's
// constants once.
template <typename Kernel>
unsigned resident_blocks(Kernel kernel) {
  int device = 0, sms = 0, per_sm = 0;
  check_cuda(cudaGetDevice(&device), "adamw: cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "adamw: cudaDeviceGetAttribute");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0),
             "adamw: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return static_cast<unsigned>(sms * (per_sm < 1 ? 1 : per_sm));
}

template <typename T, typename S>
void launch_adamw(const KernelArgs& a, const LaunchContext& ctx, const AdamwScalars& scalars) {
  AdamwArrays<T, S> arrays{in_ptr<T>(a, 0),  in_ptr<T>(a, 1),  in_ptr<S>(a, 2),
                           in_ptr<S>(a, 3),  out_ptr<T>(a, 0), out_ptr<S>(a, 1),
                           out_ptr<S>(a, 2), a.in[0]->numel(), 0};
  const bool aligned = aligned_to(arrays.param, sizeof(Pack<T>)) && aligned_to(arrays.grad, sizeof(Pack<T>)) &&
                       aligned_to(arrays.out_param, sizeof(Pack<T>)) && aligned_to(arrays.m, sizeof(Pack<S>)) &&
                       aligned_to(arrays.v, sizeof(Pack<S>)) && aligned_to(arrays.out_m, sizeof(Pack<S>)) &&
                       aligned_to(arrays.out_v, sizeof(Pack<S>));
  if (aligned) arrays.packs = arrays.n / kPack;
  const int64_t work = aligned ? arrays.packs + arrays.n % kPack : arrays.n;
  const auto kernel = adamw_kernel<T, S>;
  const unsigned full = resident_blocks(kernel), needed = blocks_for(work, kThreads);
  const unsigned blocks = needed < full ? needed : full;
  kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(arrays, scalars);
  check_launch("adamw");
}

void adamw(const KernelArgs& a, const LaunchContext& ctx) {
  // The step (CPU: MT_CHECK(step >= 1)), the lr and apply_if_finite are read on the device: see step_constants.
  const double beta1 = a.attrs.get(attr::beta1), beta2 = a.attrs.get(attr::beta2), eps = a.attrs.get(attr::eps),
               weight_decay = a.attrs.get(attr::weight_decay);
  const bool gated = a.in.size() == 7;
  const AdamwScalars scalars{in_ptr<double>(a, 4),
                             in_ptr<int64_t>(a, 5),
                             gated ? a.in[6]->raw() : nullptr,
                             gated ? a.in[6]->dtype() : DType::f64,
                             beta1,
                             beta2,
                             weight_decay,
                             static_cast<float>(beta1),
                             static_cast<float>(beta2),
                             static_cast<float>(eps)};
  // Moments: the param's dtype, or bf16 for f32 params (f32 math either way).
  if (a.in[0]->dtype() == DType::f32 && a.in[2]->dtype() == DType::bf16)
    return launch_adamw<float, __nv_bfloat16>(a, ctx, scalars);
  by_float_type(a.in[0]->dtype(), [&](auto z) {
    using T = decltype(z);
    launch_adamw<T, T>(a, ctx, scalars);
  });
}

}  // namespace

void add_optimizer_kernels(const AddKernel& add) {
  add("clip_coefficient", clip_coefficient);
  add("adamw", adamw);
}

}  // namespace meshtrain::kernels::cuda::ops
