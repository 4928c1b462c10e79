// What the engine's own commands (train, lower, estimate) share: their words
// after the command (--help, flags, options, and --section.key value config
// overrides), and writing a text file with errors that name it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace meshtrain::cli {

struct CommandArgs {
  bool help = false;
  std::set<std::string> flags;
  std::map<std::string, std::string> options;  // --config and the command's own
  std::vector<std::pair<std::string, std::string>> overrides;
};

// `flags` take no value; `options` (and --config) take one (--key value or
// --key=value); any other --section.key value is a config override.
CommandArgs parse_args(const std::string& command, const std::vector<std::string>& args,
                       const std::set<std::string>& flags, const std::set<std::string>& options);
// An option's integer value, or `fallback` when not given; fails naming it.
int64_t integer_option(const CommandArgs& a, const std::string& command, const std::string& key, int64_t fallback);
void write_text(const std::string& path, const std::string& text);

}  // namespace meshtrain::cli
