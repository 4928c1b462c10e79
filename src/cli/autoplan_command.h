// `meshtrain autoplan`: the fastest layouts of a config's step on N ranks,
// found by costing every legal plan with the estimate (autoplan/search.h).
#pragma once

#include <CLI/CLI.hpp>

#include "cli/command.h"

namespace meshtrain::cli {

// Added to `app` with its options.
Command add_autoplan_command(CLI::App& app);

}  // namespace meshtrain::cli
