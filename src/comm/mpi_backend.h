// The `mpi` backend: ranks are processes under mpirun (one host or many).
// Collectives are MPI non-blocking calls, driven by a progress thread so that
// they advance while the caller computes; every MPI call of the process goes
// through one lock (MPI_THREAD_SERIALIZED).
#pragma once

#include <mutex>

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

}  // namespace meshtrain::comm
