// `meshtrain bench comm`: busBw of meshtrain's collectives next to the plain
// MPI call, measured in the same run (nccl-tests conventions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/command.h"

namespace meshtrain::cli {

struct CommBenchOptions {
  // all_to_all_uneven: all_to_all with MoE-like uneven blocks, next to MPI_Alltoallv.
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_uneven"};
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 64 << 20;
  int rounds = 5;      // alternating meshtrain / MPI rounds; medians are reported
  int iters = 0;       // per round; 0: chosen per size (5..50)
  bool verify = true;  // meshtrain's cross-rank fingerprint check
  bool json = false;
  // Run the collectives in groups of this many ranks, all groups at once
  // (a mesh dim of that size inside a larger job); 0: the whole world. No
  // MPI baseline then.
  int group_size = 0;
  // With group_size: only the first group runs the collectives; the other
  // ranks keep their cores busy meanwhile (a pipeline's other stages
  // computing beside a stage's collectives).
  bool others_compute = false;
  // Busy time before each collective, left out of the time reported (a
  // step's compute between its collectives); 0: back to back.
  int64_t compute_us = 0;
  // Time `bucket` collectives of each size at once, as the trainer's
  // bucketing runs them: packed into one buffer (bucket_pack), one
  // collective, unpacked (bucket_unpack); next to the same collectives as
  // plain MPI calls one by one, and as one plain MPI call on the packed
  // bytes. 0: one collective at a time.
  int bucket = 0;
  // As schedule.bucket_mode = "size_cap" does: consecutive members share a
  // bucket while its bytes (as the size column counts them) stay within this cap, and a member alone runs as
  // a plain collective. 0: all `bucket` members in one.
  int64_t bucket_cap = 0;
};

// Run under mpirun; rank 0 prints. Returns the process exit code.
int run_comm_bench(const CommBenchOptions& options);

// `meshtrain bench comm`, added to `app` with its options.
Command add_bench_comm_command(CLI::App& app);

}  // namespace meshtrain::cli
