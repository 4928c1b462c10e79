// Every rank of a job must train the same config on the same data: a rank
// given another learning rate, seed, step count or data file would update
// its shards by its own rules, or wait forever for a collective the others
// never make. Checked once, before anything else talks between the ranks
// but fail_together's one all_reduce (an error every rank meets, said once).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "config/config.h"

namespace meshtrain::train {

// A collective. Throws on every rank when some rank's config keys or data
// files differ from rank 0's (`file_digests`: what each is, as the error
// names it, and its digest: data.path's TokenDataset::digest, validation.path's
// file_digest):
// rank 0 with the error (the first key that differs and each rank's value of
// it), the others once rank 0 has ended the job.
using FileDigests = std::vector<std::pair<std::string, std::string>>;
void check_ranks_agree(const config::TrainConfig& config, const FileDigests& file_digests, comm::ProcessGroup& world);

// Runs `work` on every rank; where it throws a meshtrain::Error on some, the
// lowest such rank rethrows it (main says it and ends the job) and the others
// wait to be ended, so that an error every rank meets is said once. A
// collective (null `world`: one rank, `work` alone).
void fail_together(comm::ProcessGroup* world, const std::function<void()>& work);

}  // namespace meshtrain::train
