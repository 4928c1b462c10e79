// CUDA kernel of matmul (graph/ops/matmul.cpp): batched GEMM on cuBLASLt, with plans cached per shape.
#include <cublasLt.h>

#include <compare>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "graph/ops/matmul.h"
#include "kernels/cuda/ops/families.h"

namespace meshtrain::kernels::cuda::ops {

namespace {

// One GEMM as cuBLASLt runs it: C[b] = op(A[b]) op(B[b]) for b in [0, batch), all row-major.
struct GemmShape {
  int64_t batch, m, n, k;
  bool transpose_a, transpose_b;
  int64_t b_stride;  // elements between B's matrices; 0: B shared over the batch
  auto operator<=>(const GemmShape&) const = default;
};

// The element, compute and scale types of a dtype's GEMM.
struct GemmTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

GemmTypes gemm_types(DType t, bool allow_tf32) {
  switch (t) {
    case DType::bf16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};  // f32 accumulation, rounded to bf16 once
    case DType::f32:
      return {CUDA_R_32F, allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    default:
      throw InvalidArgument(fmt::format("no CUDA kernel of matmul for dtype {}", dtype_name(t)));
  }
}

[[noreturn]] void throw_gemm_error(const std::string& what, DType t, const GemmShape& g) {
  throw Error(fmt::format("matmul on cuBLASLt: {} for {} batch {}, m {}, n {}, k {}, transpose_a {}, transpose_b {}{}",
                          what, dtype_name(t), g.batch, g.m, g.n, g.k, g.transpose_a, g.transpose_b,
                          g.b_stride == 0 && g.batch > 1 ? " (B shared over the batch)" : ""));
}

void check_lt(cublasStatus_t status, const char* call, DType t, const GemmShape& g) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_gemm_error(fmt::format("{} failed with status {} ({}: {})", call, static_cast<int>(status),
                               cublasLtGetStatusName(status), cublasLtGetStatusString(status)),
                   t, g);
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing a pointer's address.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lowest_bit = address & (~address + 1);
  return lowest_bit == 0 || lowest_bit > 256 ? 256u : static_cast<uint32_t>(lowest_bit);
}

// What a plan depends on: the GEMM, its types, the operands' alignments and the device.
struct PlanKey {
  int device;
  const void* handle;
  DType dtype;
  bool tf32;
  GemmShape gemm;
  uint32_t align_a, align_b, align_c;
  size_t workspace_bytes;
  auto operator<=>(const PlanKey&) const = default;
};

// cuBLASLt's descriptors and chosen algorithm for one key, made once (host-only work).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t b_layout = nullptr;  // cuBLASLt's A: the row-major B read as column-major
  cublasLtMatrixLayout_t a_layout = nullptr;  // cuBLASLt's B: the row-major A read as column-major
  cublasLtMatrixLayout_t c_layout = nullptr;  // C and D: the row-major C read as column-major
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {  // statuses ignored: nothing to do about a failed destroy
    if (c_layout) cublasLtMatrixLayoutDestroy(c_layout);
    if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
    if (b_layout) cublasLtMatrixLayoutDestroy(b_layout);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename V>
void set_layout_attr(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, V value, DType t,
                     const GemmShape& g) {
  check_lt(cublasLtMatrixLayoutSetAttribute(layout, attr, &value, sizeof(value)), "cublasLtMatrixLayoutSetAttribute", t,
           g);
}

// A column-major layout of rows x cols with leading dim ld, g.batch matrices `stride` elements apart.
void make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                 cublasLtMatrixLayout_t* slot, DType t, const GemmShape& g) {
  check_lt(cublasLtMatrixLayoutCreate(slot, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
           "cublasLtMatrixLayoutCreate", t, g);
  if (g.batch > 1) {
    set_layout_attr(*slot, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(g.batch), t, g);
    set_layout_attr(*slot, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride, t, g);
  }
}

// The matmul descriptor of C^T = op(B)^T op(A)^T: column-major views of the row-major operands. Row-major B
// ([K, N], or [N, K] transposed) read column-major is B^T ([N, K]) or needs a transpose; likewise A.
void make_descriptors(Plan& plan, const GemmTypes& types, DType t, const GemmShape& g) {
  check_lt(cublasLtMatmulDescCreate(&plan.op, types.compute, types.scale), "cublasLtMatmulDescCreate", t, g);
  const cublasOperation_t op_b = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)),
           "cublasLtMatmulDescSetAttribute(TRANSA)", t, g);
  check_lt(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)),
           "cublasLtMatmulDescSetAttribute(TRANSB)", t, g);
  // Stored (column-major) extents: B is N x K (ld N), or K x N (ld K) when transposed; A is K x M (ld K), or
  // M x K (ld M) when transposed; C is N x M (ld N).
  const int64_t b_rows = g.transpose_b ? g.k : g.n, b_cols = g.transpose_b ? g.n : g.k;
  const int64_t a_rows = g.transpose_a ? g.m : g.k, a_cols = g.transpose_a ? g.k : g.m;
  make_layout(types.data, b_rows, b_cols, b_rows, g.b_stride, &plan.b_layout, t, g);
  make_layout(types.data, a_rows, a_cols, a_rows, g.m * g.k, &plan.a_layout, t, g);
  make_layout(types.data, g.n, g.m, g.n, g.m * g.n, &plan.c_layout, t, g);
}

// The heuristic's best algorithm within the workspace and the operands' alignments.
void choose_algorithm(Plan& plan, const PlanKey& key, cublasLtHandle_t handle, DType t, const GemmShape& g) {
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", t, g);
  const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      owned(pref, &cublasLtMatmulPreferenceDestroy);
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
             "cublasLtMatmulPreferenceSetAttribute", t, g);
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(key.workspace_bytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // cuBLASLt's A is our B
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(handle, plan.op, plan.b_layout, plan.a_layout, plan.c_layout, plan.c_layout,
                                          pref, 1, &result, &found),
           "cublasLtMatmulAlgoGetHeuristic", t, g);
  if (found < 1) throw_gemm_error("cublasLtMatmulAlgoGetHeuristic found no algorithm", t, g);
  check_lt(result.state, "cublasLtMatmulAlgoGetHeuristic's algorithm", t, g);
  plan.algo = result.algo;
}

// The plan of a key, made on first use. Plans are never freed (a handful of shapes per training graph), so a
// pointer stays valid after the lock is released.
const Plan& plan_for(const PlanKey& key, cublasLtHandle_t handle, const GemmTypes& types, const GemmShape& g) {
  static auto* mutex = new std::mutex;
  static auto* plans = new std::map<PlanKey, std::unique_ptr<Plan>>;
  const std::lock_guard<std::mutex> lock(*mutex);
  if (const auto it = plans->find(key); it != plans->end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  make_descriptors(*plan, types, key.dtype, g);
  choose_algorithm(*plan, key, handle, key.dtype, g);
  return *plans->emplace(key, std::move(plan)).first->second;
}

// The GEMM's shape: a batch over a shared B without transpose_a is one GEMM over the batch's rows (A and C are
// contiguous [batch * M, K] and [batch * M, N]).
GemmShape gemm_shape(const KernelArgs& a) {
  const bool ta = a.attrs.get(attr::transpose_a), tb = a.attrs.get(attr::transpose_b);
  const graph::ops::MatmulDims d = graph::ops::matmul_dims(a.in[0]->shape(), a.in[1]->shape(), ta, tb);
  if (d.b_shared && !ta) return {1, d.batch * d.m, d.n, d.k, ta, tb, 0};
  return {d.batch, d.m, d.n, d.k, ta, tb, d.b_shared ? 0 : d.k * d.n};
}

// C = op(A) op(B) of the kernel's two inputs and output, in the shape `g`.
void run_gemm(const KernelArgs& a, const LaunchContext& ctx, const GemmShape& g) {
  const DType t = a.in[0]->dtype();
  MT_CHECK(a.in[1]->dtype() == t && a.out[0]->dtype() == t, "matmul: dtypes differ: {}, {} and output {}",
           dtype_name(t), dtype_name(a.in[1]->dtype()), dtype_name(a.out[0]->dtype()));
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;  // an empty output
  void* c = a.out[0]->raw();
  if (g.k == 0) {  // an empty sum: zeros, as the CPU's GEMM with beta 0 writes
    check_cuda(cudaMemsetAsync(c, 0, a.out[0]->nbytes(), stream_of(ctx)), "matmul: cudaMemsetAsync");
    return;
  }
  MT_CHECK(g.batch <= std::numeric_limits<int32_t>::max(), "matmul: a batch of {} matrices is more than cuBLASLt takes",
           g.batch);
  const bool tf32 = t == DType::f32 && ctx.allow_tf32;
  const GemmTypes types = gemm_types(t, tf32);
  const void* a_ptr = a.in[0]->raw();
  const void* b_ptr = a.in[1]->raw();
  int device = 0;
  check_cuda(cudaGetDevice(&device), "matmul: cudaGetDevice");
  auto* handle = static_cast<cublasLtHandle_t>(ctx.cublaslt);
  const PlanKey key{
      device, handle, t, tf32, g, alignment_of(a_ptr), alignment_of(b_ptr), alignment_of(c), ctx.workspace_bytes};
  const Plan& plan = plan_for(key, handle, types, g);
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = types.scale == CUDA_R_64F;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = f64 ? static_cast<const void*>(&zero_d) : &zero_f;
  check_lt(cublasLtMatmul(handle, plan.op, alpha, b_ptr, plan.b_layout, a_ptr, plan.a_layout, beta, c, plan.c_layout, c,
                          plan.c_layout, &plan.algo, ctx.workspace, ctx.workspace_bytes, stream_of(ctx)),
           "cublasLtMatmul", t, g);
}

void run_matmul(const KernelArgs& a, const LaunchContext& ctx) { run_gemm(a, ctx, gemm_shape(a)); }

// rows_matmul: x [..., P]^T y [..., Q], one GEMM over every row (transpose_a).
void run_rows_matmul(const KernelArgs& a, const LaunchContext& ctx) {
  const int64_t p = a.in[0]->shape().dim(-1), q = a.in[1]->shape().dim(-1);
  run_gemm(a, ctx, {1, p, q, p > 0 ? a.in[0]->numel() / p : 0, true, false, 0});
}

}  // namespace

void add_matmul_kernels(const AddKernel& add) {
  add("matmul", run_matmul);
  add("rows_matmul", run_rows_matmul);
}

}  // namespace meshtrain::kernels::cuda::ops
