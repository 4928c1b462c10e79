// gtest under mpirun: every rank runs every test; rank 0 prints; the exit
// code is non-zero on every rank when any rank failed.
#include <gtest/gtest.h>

#include "comm/mpi_backend.h"
#include "mpi_world.h"

namespace {
meshtrain::comm::ProcessGroupPtr g_world;

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

meshtrain::comm::ProcessGroup& mtest::mpi_world() { return *g_world; }

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  meshtrain::comm::GroupOptions options;
  options.timeout = std::chrono::seconds(60);
  g_world = meshtrain::comm::create_world("mpi", options);
  if (g_world->rank() != 0) {
    // Other ranks print only their failures, prefixed with the rank.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(g_world->rank()));
  }
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  meshtrain::Tensor flag = meshtrain::Tensor::empty({1}, meshtrain::DType::i32);
  flag.data<int32_t>()[0] = local_failed;
  g_world->all_reduce(flag, meshtrain::comm::ReduceOp::max)->wait();
  const int any_failed = flag.data<int32_t>()[0];
  if (g_world->rank() == 0)
    std::printf("[mpi] %d ranks: %s\n", g_world->size(), any_failed ? "FAILED on some rank" : "all ranks passed");
  g_world.reset();
  return any_failed;
}
