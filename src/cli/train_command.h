// `meshtrain train --config FILE [--section.key value ...]`, and
// `meshtrain lower`, which prints any rank's lowered step without running it,
// and `meshtrain export`, a checkpoint's weights as one Hugging Face file.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli/command.h"
#include "cli/command_args.h"

namespace meshtrain::cli {

// `meshtrain train` and `meshtrain lower`, each added to `app` with its options.
Command add_train_command(CLI::App& app);
Command add_lower_command(CLI::App& app);

// `checkpoint`: a checkpoint folder, or a checkpoint.folder (its newest). Returns the exit code.
int run_export(const std::string& checkpoint, const std::string& out);

// `meshtrain export`, added to `app` with its options.
Command add_export_command(CLI::App& app);

}  // namespace meshtrain::cli
