// `meshtrain train --config FILE [--section.key value ...]`, and
// `meshtrain lower`, which prints any rank's lowered step without running it,
// and `meshtrain export`, a checkpoint's weights as one Hugging Face file.
#pragma once

#include <string>
#include <vector>

namespace meshtrain::cli {

// args: the words after `train`. Returns the exit code.
int run_train(const std::vector<std::string>& args);
std::string train_help();

// args: the words after `lower`. Returns the exit code.
int run_lower(const std::vector<std::string>& args);
std::string lower_help();

// `checkpoint`: a checkpoint folder, or a checkpoint.folder (its newest). Returns the exit code.
int run_export(const std::string& checkpoint, const std::string& out);

}  // namespace meshtrain::cli
