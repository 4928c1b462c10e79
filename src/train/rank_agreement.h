// Every rank of a job must train the same config on the same data: a rank
// given another learning rate, seed, step count or data file would update
// its shards by its own rules, or wait forever for a collective the others
// never make. Checked once, before anything else talks between the ranks.
#pragma once

#include "comm/process_group.h"
#include "config/config.h"

namespace meshtrain::train {

// A collective. Throws on every rank when some rank's config keys or data
// (`data_digest`: TokenDataset::digest of data.path) differ from rank 0's: rank 0 with the error (the first key that
// differs and each rank's value of it), the others once rank 0 has ended
// the job.
void check_ranks_agree(const config::TrainConfig& config, const std::string& data_digest, comm::ProcessGroup& world);

}  // namespace meshtrain::train
