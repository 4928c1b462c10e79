// `meshtrain estimate`: a config's training step costed for an N-rank job on
// a hardware profile without running it (estimate/estimate.h).
#pragma once

#include <CLI/CLI.hpp>

#include "cli/command.h"

namespace meshtrain::cli {

// Added to `app` with its options.
Command add_estimate_command(CLI::App& app);

}  // namespace meshtrain::cli
