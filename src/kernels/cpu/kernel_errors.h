// How the CPU kernels fail: a oneDNN status named, and a failure carried out
// of an OpenMP region to the caller.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>

namespace meshtrain::kernels::cpu {

// Throws meshtrain::Error for a failed oneDNN sgemm of m x n x k, naming
// out-of-memory and what to do about it (cpu_kernels.cpp).
[[noreturn]] void throw_gemm_failure(int status, int64_t m, int64_t n, int64_t k);

// An exception thrown inside an OpenMP region ends the process
// (std::terminate): a loop body that may throw (an allocation, a GEMM)
// catches it into keep(), and the bodies after it skip (failed()); rethrow()
// throws the first one once the region is over.
class RegionErrors {
 public:
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void keep(std::exception_ptr error) {
    std::lock_guard lock(mu_);
    if (!first_) first_ = std::move(error);
    failed_.store(true, std::memory_order_relaxed);
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::exception_ptr first_;
};

}  // namespace meshtrain::kernels::cpu
