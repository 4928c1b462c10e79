// The `local` backend: every rank is a thread of one process and collectives
// run on shared memory. For fast unit tests; real multi-rank runs use `mpi`.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/process_group.h"

namespace meshtrain::comm {

class LocalWorld {
 public:
  explicit LocalWorld(int size, GroupOptions options = {});
  int size() const { return static_cast<int>(groups_.size()); }
  // The world group of `rank`: hand it to the thread that plays that rank.
  ProcessGroupPtr group(int rank) const;
  // Run fn on `size` threads, one per rank, and join them. Rethrows a single
  // rank's exception as it is; several ranks' errors as one Error naming each.
  void run(const std::function<void(ProcessGroup&)>& fn) const;

 private:
  std::vector<ProcessGroupPtr> groups_;
};

}  // namespace meshtrain::comm
