// CPU kernels attached to graph ops by name. Each op family's kernels are in
// kernels/cpu/ops/<family>.cpp, mirroring graph/ops/; an executor looks a
// node's kernel up once, when it plans the graph.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"
#include "kernels/kernel_args.h"

namespace meshtrain::kernels::cpu {

using kernels::KernelArgs;

// Takes f32, f64 and bf16 operands (bf16 computed in f32, rounded once per output element).
using CpuKernel = std::function<void(const KernelArgs& args)>;

// The CPU kernel of an op, or nullptr when it has none (the built-in
// families are registered on first use).
const CpuKernel* find_cpu_kernel(const std::string& op);

// Attaches a kernel to an op defined outside graph/ops (an extension, or a
// test's). Fails if the op already has one.
void register_cpu_kernel(const std::string& op, CpuKernel kernel);

// The threads each kernel may use (OpenMP, which OpenBLAS's OpenMP build and
// oneDNN share).
void set_cpu_threads(int threads);
int cpu_threads();
// The cores this process may run on (its affinity mask).
int available_cores();

// FP8 (ops/matmul.cpp): an FP8 GEMM whose operand holds a NaN or infinity
// has no scale for it and gives NaNs; the first such operand's name since
// the last call ("model.layers.3.mlp.down_proj input"), or "" when none.
// The trainer names it when a step is not finite.
std::string take_fp8_nonfinite_operand();

}  // namespace meshtrain::kernels::cpu
