// `meshtrain train --config FILE [--section.key value ...]`.
#pragma once

#include <string>
#include <vector>

namespace meshtrain::cli {

// args: the words after `train`. Returns the exit code.
int run_train(const std::vector<std::string>& args);
std::string train_help();

}  // namespace meshtrain::cli
