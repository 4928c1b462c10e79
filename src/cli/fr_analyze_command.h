// `meshtrain fr-analyze DIR`: every rank's flight-recorder dump read and the
// first collective where the ranks went out of step named (comm/fr_analyze.h).
#pragma once

#include "cli/command.h"

namespace meshtrain::cli {

// Added to `app` with its options; exit code 0: no mismatch, 1: one found.
Command add_fr_analyze_command(CLI::App& app);

}  // namespace meshtrain::cli
