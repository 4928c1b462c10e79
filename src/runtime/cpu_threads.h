// How many kernel threads a rank runs when several ranks share a host's
// cores (under a launcher such as mpirun), and what sharing them costs.
#pragma once

#include <string>
#include <vector>

namespace meshtrain::runtime {

// Fits the process to what its kernels need; call it first, before any
// thread starts. A stack limit (ulimit -s) under 1 MiB, on which oneDNN's
// kernel generation overflows, is raised to 8 MiB (or the hard limit) for
// the main thread and every thread started after; a kernel thread count
// (OMP_NUM_THREADS) over the cores this process may use is capped to them
// (100000 crashed libgomp). Returns a line saying each change; throws when
// the hard stack limit is under 1 MiB.
std::vector<std::string> fit_cpu_resources();

// Under a launcher with `local_ranks` ranks on this host: the threads each
// rank's kernels use, so the ranks share the cores instead of each spinning
// up a thread per core (4 ranks x 2 OpenMP threads on 2 cores trained 25x
// slower). The user's OMP_NUM_THREADS wins when set. Returns the count.
int set_threads_per_rank(int local_ranks);
// How much slower one of `local_ranks` ranks on this host runs a kernel than
// the same threads alone on it: the ranks' threads over the cores (the
// OpenMP threads set_threads_per_rank gives each), at least 1.
double shared_core_slowdown(int local_ranks);
// Whether a rank of `threads` kernel threads, one of `local_ranks` on this
// host, has a core beyond them (of its share of the host's, within its
// affinity mask) for background communication progress
// (comm::GroupOptions::background_progress).
bool spare_core_for_progress(int threads, int local_ranks);

}  // namespace meshtrain::runtime
