// What the engine's own commands (train, lower, estimate) share: their
// options on the command's CLI11 parser (--config, the command's own, and
// every config key as --section.key value), and writing a text file with
// errors that name it.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace meshtrain::cli {

struct CommandArgs {
  std::set<std::string> flags;
  std::map<std::string, std::string> options;                  // --config and the command's own
  std::vector<std::pair<std::string, std::string>> overrides;  // config keys, as given
  std::vector<std::string> unexpected;                         // words no option took
};

// An option or flag of a command: its name (without --), the name of its
// value in --help (none for a flag) and what it does.
struct OptionSpec {
  std::string name, value_name, help;
  bool required = false;
};

// Registers on `command`: --config FILE (required), `options` (a value each),
// `flags`, and every config key as --section.key VALUE (shown with its default
// and what a value must be; given twice, the last wins); parsing fills `args`.
void add_engine_options(CLI::App& command, CommandArgs& args, const std::vector<OptionSpec>& options,
                        const std::vector<OptionSpec>& flags);
// Throws naming the first word no option took: an unknown config key as
// the config names one (with the known keys), anything else as unexpected.
void check_no_unexpected(const CommandArgs& a, const std::string& command);
// An option's integer value, or `fallback` when not given; fails naming it.
int64_t integer_option(const CommandArgs& a, const std::string& command, const std::string& key, int64_t fallback);
// The same for a number (a decimal or exponent form).
double number_option(const CommandArgs& a, const std::string& command, const std::string& key, double fallback);
void write_text(const std::string& path, const std::string& text);

}  // namespace meshtrain::cli
