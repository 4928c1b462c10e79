// `meshtrain estimate`: a config's training step costed for an N-rank job on
// a hardware profile without running it (estimate/estimate.h).
#pragma once

#include <string>
#include <vector>

namespace meshtrain::cli {

// args: the words after `estimate`. Returns the exit code.
int run_estimate(const std::vector<std::string>& args);
std::string estimate_help();

}  // namespace meshtrain::cli
