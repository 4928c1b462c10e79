// The `mpi` backend: ranks are processes under mpirun (one host or many).
// Collectives are MPI non-blocking calls, driven by a progress thread so that
// they advance while the caller computes; every MPI call of the process goes
// through one lock (MPI_THREAD_SERIALIZED).
#pragma once

#include <mutex>
#include <vector>

#include "comm/process_group.h"

namespace meshtrain::comm {

// Initialise MPI (once) and return this process's world group.
ProcessGroupPtr create_mpi_world(GroupOptions options = {});

// The lock every MPI call of this process holds. Code outside meshtrain that
// calls MPI directly while meshtrain operations may be in flight takes it too.
std::mutex& mpi_mutex();

// End the job now with `code` on every rank (MPI_Abort), after giving peers
// a moment to write their flight-recorder dumps.
[[noreturn]] void mpi_abort_job(int code);

// Whether MPI has been initialised in this process (a world was created).
bool mpi_initialized();

// Whether one-host groups may pass their collectives' first messages
// through shared memory (ProcessGroup::shares_memory): not where
// MESHTRAIN_SHM=0, nor where Open MPI is told to use no shared-memory
// transport (OMPI_MCA_btl naming neither vader nor sm, as "tcp,self" does to
// stand in for ranks on different hosts). Read as each group is made.
bool shm_allowed();

// The job's size and this process's rank as the launcher (mpirun, or a PMI
// launcher) announces them in the environment, read without initialising
// MPI: {1, 0} when the process was not launched as part of a job.
struct LaunchedRank {
  int size = 1, rank = 0;
  int local_size = 1;  // ranks of the job on this host
};
LaunchedRank launched_rank();

// The baseline meshtrain's collectives are measured against: the plain
// blocking MPI call on MPI_COMM_WORLD, for f32 `in` (and `out` for all_gather,
// reduce_scatter and all_to_all, sized as meshtrain's). all_reduce works in
// place on `in`. The caller holds mpi_mutex().
void plain_mpi_collective(OpType op, Tensor& in, Tensor& out);
// The baseline of an uneven all_to_all: the plain blocking MPI_Alltoallv on
// MPI_COMM_WORLD of f32 blocks (counts in elements per rank). The caller holds
// mpi_mutex().
void plain_mpi_all_to_allv(const Tensor& in, Tensor& out, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts);

}  // namespace meshtrain::comm
