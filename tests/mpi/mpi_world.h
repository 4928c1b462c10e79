// The world group of an mpirun test process, created once by mpi_test_main.
#pragma once

#include "comm/process_group.h"

namespace mtest {
meshtrain::comm::ProcessGroup& mpi_world();
}
