// CUDA kernels of the elementwise ops (graph/ops/elementwise.cpp): fills, casts, arithmetic and activations.
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

constexpr int kThreads = 256;
constexpr int kVectorBytes = 16;  // one vector load or store

// kVec elements of T moved by one load or store (kVec * sizeof(T) bytes, aligned to that).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Whether every pointer is aligned to `bytes`.
template <typename... P>
bool aligned_to(size_t bytes, const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % bytes == 0) && ...);
}

__device__ __forceinline__ int64_t first_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- maps: each output element from the same element of each input, computed in f32 ----

template <typename T, int kIn, int kOut>
struct Arrays {
  const T* in[kIn];
  T* out[kOut];
};

// Functors with state to read on the device (scale_by's scalar) load it in load_state, once per thread.
struct NoState {
  __device__ void load_state() {}
};

// One element of each input and output, in f32.
template <int kVec, typename T, int kIn, int kOut, typename Op>
__device__ __forceinline__ void map_pack(const Arrays<T, kIn, kOut>& a, int64_t p, const Op& op) {
  using P = Pack<T, kVec>;
  P x[kIn], y[kOut];
#pragma unroll
  for (int i = 0; i < kIn; ++i) x[i] = reinterpret_cast<const P*>(a.in[i])[p];
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    float xs[kIn], ys[kOut];
#pragma unroll
    for (int i = 0; i < kIn; ++i) xs[i] = to_f32(x[i].v[e]);
    op(xs, ys);
#pragma unroll
    for (int o = 0; o < kOut; ++o) y[o].v[e] = from_f32<T>(ys[o]);
  }
#pragma unroll
  for (int o = 0; o < kOut; ++o) reinterpret_cast<P*>(a.out[o])[p] = y[o];
}

// Packs of kVec elements, then the last n % kVec elements one by one. Every
// input element is read before the output element of its index is written
// (by the same thread), so an output may be an input's storage.
template <int kVec, typename T, int kIn, int kOut, typename Op>
__global__ void map_kernel(Arrays<T, kIn, kOut> a, int64_t n, Op op) {
  op.load_state();
  const int64_t packs = n / kVec;
  for (int64_t p = first_thread(); p < packs; p += thread_count()) map_pack<kVec>(a, p, op);
  for (int64_t i = packs * kVec + first_thread(); i < n; i += thread_count()) map_pack<1>(a, i, op);
}

// Runs op over n elements of a's arrays, with vector loads where every array is 16-byte aligned.
template <typename T, int kIn, int kOut, typename Op>
void launch_map(const Arrays<T, kIn, kOut>& a, int64_t n, const Op& op, const LaunchContext& ctx, const char* name) {
  if (n == 0) return;
  constexpr int kVec = kVectorBytes / sizeof(T);
  bool vector = true;
  for (const T* p : a.in) vector = vector && aligned_to(kVectorBytes, p);
  for (const T* p : a.out) vector = vector && aligned_to(kVectorBytes, p);
  if (vector)
    map_kernel<kVec><<<blocks_for(n / kVec + 1, kThreads), kThreads, 0, stream_of(ctx)>>>(a, n, op);
  else
    map_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a, n, op);
  check_launch(name);
}

// An op of float tensors with kIn inputs and kOut outputs of one dtype (that of in[0]), n = out[0]'s elements.
template <int kIn, int kOut, typename Op>
void run_map(const KernelArgs& a, const Op& op, const LaunchContext& ctx, const char* name) {
  by_float_type(a.in[0]->dtype(), [&](auto z) {
    using T = decltype(z);
    Arrays<T, kIn, kOut> arrays;
    for (int i = 0; i < kIn; ++i) arrays.in[i] = in_ptr<T>(a, static_cast<size_t>(i));
    for (int o = 0; o < kOut; ++o) arrays.out[o] = out_ptr<T>(a, static_cast<size_t>(o));
    launch_map(arrays, a.out[0]->numel(), op, ctx, name);
  });
}

// f64 (the gradient norm's sums of squares and their square root): the
// same ops computed in double, as the CPU's f64 kernels do. Scalar-sized.
struct AddF64 {
  __device__ double operator()(double x, double y) const { return x + y; }
};
struct MulF64 {
  __device__ double operator()(double x, double y) const { return x * y; }
};
struct SqrtF64 {
  __device__ double operator()(double x, double) const { return sqrt(x); }
};
struct ScaleF64 {
  double alpha;
  __device__ double operator()(double x, double) const { return alpha * x; }
};
template <typename F>
__global__ void map_f64_kernel(const double* x, const double* y, double* out, int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = f(x[i], y ? y[i] : 0.0);
}
template <typename F>
void run_f64(const KernelArgs& a, F f, const LaunchContext& ctx, const char* name) {
  const int64_t n = a.out[0]->numel();
  if (n == 0) return;
  const double* y = a.in.size() > 1 ? in_ptr<double>(a, 1) : nullptr;
  map_f64_kernel<<<blocks_for(n), 256, 0, stream_of(ctx)>>>(in_ptr<double>(a, 0), y, out_ptr<double>(a), n, f);
  check_launch(name);
}
bool is_f64(const KernelArgs& a) { return a.in[0]->dtype() == DType::f64; }

// exp(x) as the CPU's exp_fast on large x: clamped below f32's overflow, so
// 1 + exp(-x) stays finite (x / (1 + exp(-x)) is a tiny number, not -0, for
// x below -88.4). The clamp passes NaN over; x itself carries it to the result.
__device__ __forceinline__ float exp_clamped(float x) { return expf(fminf(x, 88.3762626647949f)); }

struct Add : NoState {
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] + x[1]; }
};
struct Mul : NoState {
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] * x[1]; }
};
struct Scale : NoState {
  float alpha;  // the CPU's static_cast<float>(alpha)
  __device__ void operator()(const float* x, float* y) const { y[0] = alpha * x[0]; }
};

// Element 0 of a one-element tensor of any GPU dtype, as the CPU's Tensor::get(0) then a cast to float.
__device__ float first_as_f32(const void* p, DType t) {
  switch (t) {
    case DType::f32:
      return *static_cast<const float*>(p);
    case DType::bf16:
      return __bfloat162float(*static_cast<const __nv_bfloat16*>(p));
    case DType::f64:
      return __double2float_rn(*static_cast<const double*>(p));
    case DType::i32:
      return __double2float_rn(static_cast<double>(*static_cast<const int32_t*>(p)));
    case DType::i64:
      return __double2float_rn(static_cast<double>(*static_cast<const int64_t*>(p)));
    default:
      return __int_as_float(0x7FC00000);  // dtypes the host check refused: NaN
  }
}

struct ScaleBy {
  const void* scalar;  // device pointer to the one-element scale
  DType scalar_type;
  float alpha;
  __device__ void load_state() { alpha = first_as_f32(scalar, scalar_type); }
  __device__ void operator()(const float* x, float* y) const { y[0] = alpha * x[0]; }
};

// sqrtf is correctly rounded, as is the CPU's sqrt in double rounded once to
// f32; rounding that to bf16 gives the correctly rounded bf16 too.
struct Sqrt : NoState {
  __device__ void operator()(const float* x, float* y) const { y[0] = sqrtf(x[0]); }
};
struct Silu : NoState {
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] / (1.0f + exp_clamped(-x[0])); }
};
struct SiluBackward : NoState {  // x, dy -> dx
  __device__ void operator()(const float* x, float* y) const {
    const float s = 1.0f / (1.0f + exp_clamped(-x[0]));
    y[0] = x[1] * s * (1.0f + x[0] * (1.0f - s));
  }
};
struct Swiglu : NoState {  // gate, up -> silu(gate) * up
  __device__ void operator()(const float* x, float* y) const { y[0] = x[0] / (1.0f + exp_clamped(-x[0])) * x[1]; }
};
struct SwigluBackward : NoState {  // gate, up, dout -> dgate, dup
  __device__ void operator()(const float* x, float* y) const {
    const float g = x[0], u = x[1], go = x[2];
    const float s = 1.0f / (1.0f + exp_clamped(-g));
    y[1] = go * g * s;
    y[0] = go * u * s * (1.0f + g * (1.0f - s));
  }
};

// ---- fills: full (a host value) and broadcast_scalar (element 0 of a device tensor) ----

// The unsigned integer type of an element size, for fills and copies that only move bits.
template <typename Fn>
void by_element_size(size_t bytes, Fn&& fn) {
  if (bytes == 2) return fn(uint16_t{});
  if (bytes == 4) return fn(uint32_t{});
  if (bytes == 8) return fn(uint64_t{});
  throw InvalidArgument(fmt::format("no CUDA kernel for elements of {} bytes", bytes));
}

// out[0, n) = *source, or value where source is null.
template <int kVec, typename U>
__global__ void fill_kernel(const U* source, U value, U* out, int64_t n) {
  if (source != nullptr) value = *source;
  Pack<U, kVec> pack;
#pragma unroll
  for (int e = 0; e < kVec; ++e) pack.v[e] = value;
  const int64_t packs = n / kVec;
  auto* packed = reinterpret_cast<Pack<U, kVec>*>(out);
  for (int64_t p = first_thread(); p < packs; p += thread_count()) packed[p] = pack;
  for (int64_t i = packs * kVec + first_thread(); i < n; i += thread_count()) out[i] = value;
}

template <typename U>
void launch_fill(const U* source, U value, U* out, int64_t n, const LaunchContext& ctx, const char* name) {
  if (n == 0) return;
  constexpr int kVec = kVectorBytes / sizeof(U);
  if (aligned_to(kVectorBytes, out))
    fill_kernel<kVec><<<blocks_for(n / kVec + 1, kThreads), kThreads, 0, stream_of(ctx)>>>(source, value, out, n);
  else
    fill_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(source, value, out, n);
  check_launch(name);
}

// As the CPU's fill: the value rounded to the dtype once (bf16: through f32, as store<bfloat16>).
void full(const KernelArgs& a, const LaunchContext& ctx) {
  const DType t = a.out[0]->dtype();
  const double value = a.attrs.get(attr::value);
  const int64_t n = a.out[0]->numel();
  if (t == DType::f32)
    return launch_fill<uint32_t>(nullptr, std::bit_cast<uint32_t>(static_cast<float>(value)), out_ptr<uint32_t>(a), n,
                                 ctx, "full");
  if (t == DType::bf16)
    return launch_fill<uint16_t>(nullptr, static_cast<uint16_t>(f32_to_bf16(static_cast<float>(value))),
                                 out_ptr<uint16_t>(a), n, ctx, "full");
  if (t == DType::f64)
    return launch_fill<uint64_t>(nullptr, std::bit_cast<uint64_t>(value), out_ptr<uint64_t>(a), n, ctx, "full");
  throw InvalidArgument(fmt::format("full: no CUDA kernel for dtype {}", dtype_name(t)));
}

void broadcast_scalar(const KernelArgs& a, const LaunchContext& ctx) {
  MT_CHECK(a.in[0]->dtype() == a.out[0]->dtype(), "broadcast_scalar: input {} and output {} differ in dtype",
           dtype_name(a.in[0]->dtype()), dtype_name(a.out[0]->dtype()));
  by_element_size(dtype_size(a.in[0]->dtype()), [&](auto z) {
    using U = decltype(z);
    launch_fill<U>(in_ptr<U>(a, 0), U{}, out_ptr<U>(a), a.out[0]->numel(), ctx, "broadcast_scalar");
  });
}

// ---- cast: as the CPU's convert (f32 <-> bf16 directly, the other pairs through double) ----

template <typename S, typename D>
__device__ __forceinline__ D convert_element(S x) {
  if constexpr (std::is_same_v<S, float> && std::is_same_v<D, __nv_bfloat16>)
    return from_f32<__nv_bfloat16>(x);
  else if constexpr (std::is_same_v<S, __nv_bfloat16> && std::is_same_v<D, float>)
    return to_f32(x);
  else
    return from_f64<D>(to_f64(x));
}

template <int kVec, typename S, typename D>
__global__ void cast_kernel(const S* in, D* out, int64_t n) {
  const int64_t packs = n / kVec;
  const auto* in_packs = reinterpret_cast<const Pack<S, kVec>*>(in);
  auto* out_packs = reinterpret_cast<Pack<D, kVec>*>(out);
  for (int64_t p = first_thread(); p < packs; p += thread_count()) {
    const Pack<S, kVec> x = in_packs[p];
    Pack<D, kVec> y;
#pragma unroll
    for (int e = 0; e < kVec; ++e) y.v[e] = convert_element<S, D>(x.v[e]);
    out_packs[p] = y;
  }
  for (int64_t i = packs * kVec + first_thread(); i < n; i += thread_count()) out[i] = convert_element<S, D>(in[i]);
}

// The device type of a dtype cast converts: the float types and the integers.
template <typename Fn>
void by_cast_type(DType t, Fn&& fn) {
  if (t == DType::i32) return fn(int32_t{});
  if (t == DType::i64) return fn(int64_t{});
  if (t == DType::f64) return fn(double{});
  by_float_type(t, fn);
}

void cast(const KernelArgs& a, const LaunchContext& ctx) {
  const DType from = a.in[0]->dtype(), to = a.out[0]->dtype();
  const int64_t n = a.in[0]->numel();
  if (n == 0) return;
  if (from == to) {
    check_cuda(cudaMemcpyAsync(a.out[0]->raw(), a.in[0]->raw(), static_cast<size_t>(n) * dtype_size(from),
                               cudaMemcpyDeviceToDevice, stream_of(ctx)),
               "cast");
    return;
  }
  by_cast_type(from, [&](auto s) {
    by_cast_type(to, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      constexpr int kVec = 4;
      const S* in = in_ptr<S>(a, 0);
      D* out = out_ptr<D>(a);
      if (aligned_to(kVec * sizeof(S), in) && aligned_to(kVec * sizeof(D), out))
        cast_kernel<kVec><<<blocks_for(n / kVec + 1, kThreads), kThreads, 0, stream_of(ctx)>>>(in, out, n);
      else
        cast_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(in, out, n);
      check_launch("cast");
    });
  });
}

void scale_by(const KernelArgs& a, const LaunchContext& ctx) {
  const DType t = a.in[1]->dtype();
  MT_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f64 || t == DType::i32 || t == DType::i64,
           "scale_by: no CUDA kernel for a scale of dtype {}", dtype_name(t));
  MT_CHECK(a.in[1]->numel() >= 1, "scale_by: the scale has no element");
  run_map<1, 1>(a, ScaleBy{a.in[1]->raw(), t, 0.0f}, ctx, "scale_by");
}

}  // namespace

void add_elementwise_kernels(const AddKernel& add) {
  add("full", full);
  add("cast", cast);
  add("add", [](const KernelArgs& a, const LaunchContext& ctx) {
    is_f64(a) ? run_f64(a, AddF64{}, ctx, "add") : run_map<2, 1>(a, Add{}, ctx, "add");
  });
  add("mul", [](const KernelArgs& a, const LaunchContext& ctx) {
    is_f64(a) ? run_f64(a, MulF64{}, ctx, "mul") : run_map<2, 1>(a, Mul{}, ctx, "mul");
  });
  add("scale", [](const KernelArgs& a, const LaunchContext& ctx) {
    if (is_f64(a)) return run_f64(a, ScaleF64{a.attrs.get(attr::alpha)}, ctx, "scale");
    Scale op;
    op.alpha = static_cast<float>(a.attrs.get(attr::alpha));
    run_map<1, 1>(a, op, ctx, "scale");
  });
  add("scale_by", scale_by);
  add("broadcast_scalar", broadcast_scalar);
  add("sqrt", [](const KernelArgs& a, const LaunchContext& ctx) {
    is_f64(a) ? run_f64(a, SqrtF64{}, ctx, "sqrt") : run_map<1, 1>(a, Sqrt{}, ctx, "sqrt");
  });
  add("silu", [](const KernelArgs& a, const LaunchContext& ctx) { run_map<1, 1>(a, Silu{}, ctx, "silu"); });
  add("silu_backward",
      [](const KernelArgs& a, const LaunchContext& ctx) { run_map<2, 1>(a, SiluBackward{}, ctx, "silu_backward"); });
  add("swiglu", [](const KernelArgs& a, const LaunchContext& ctx) { run_map<2, 1>(a, Swiglu{}, ctx, "swiglu"); });
  add("swiglu_backward", [](const KernelArgs& a, const LaunchContext& ctx) {
    run_map<3, 2>(a, SwigluBackward{}, ctx, "swiglu_backward");
  });
}

}  // namespace meshtrain::kernels::cuda::ops
