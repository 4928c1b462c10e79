// Fault injection under mpirun: rank 1 skips the 4th all_reduce and stays
// busy elsewhere; the other ranks must time out with a clear error, every
// rank must leave a flight-recorder dump, and the job must end by itself.
#include <chrono>
#include <cstdio>
#include <thread>

#include "comm/mpi_backend.h"

using namespace meshtrain;
using namespace std::chrono;

int main() {
  comm::GroupOptions options;
  options.timeout = milliseconds(2000);
  auto pg = comm::create_world("mpi", options);
  Tensor t = Tensor::zeros({1024}, DType::f32);
  for (int i = 0; i < 3; ++i) pg->all_reduce(t)->wait();
  if (pg->rank() == 1) {
    std::printf("rank 1 skips all_reduce seq 4 and computes elsewhere\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(seconds(20));  // the job is aborted long before this ends
    return 0;
  }
  const auto t0 = steady_clock::now();
  try {
    pg->all_reduce(t)->wait();
    std::printf("NO-TIMEOUT rank %d\n", pg->rank());
    return 1;
  } catch (const TimeoutError& e) {
    const auto ms = duration_cast<milliseconds>(steady_clock::now() - t0).count();
    std::printf("TIMEOUT-OK rank %d after %lld ms: %s\n", pg->rank(), static_cast<long long>(ms), e.what());
    std::fflush(stdout);
    return 3;  // the aborted group makes the exit end the whole job
  }
}
