// A command of `meshtrain`: added to the one CLI11 parser with its own
// options by its own file (add_X_command), and run when it is the one given.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace meshtrain::cli {

struct Command {
  CLI::App* parsed = nullptr;  // true once it was given
  std::function<int()> run;    // after parsing; returns the exit code
};

}  // namespace meshtrain::cli
