#include "cli/command_args.h"

#include "config/config.h"
#include "core/error.h"
#include "core/file_io.h"

namespace meshtrain::cli {

void write_text(const std::string& path, const std::string& text) { write_file_atomically(path, text); }

void add_engine_options(CLI::App& command, CommandArgs& args, const std::vector<OptionSpec>& options,
                        const std::vector<OptionSpec>& flags) {
  std::vector<OptionSpec> all = options;
  all.insert(all.begin(), {"config", "FILE", "The training config (TOML; configs/ holds examples)", true});
  for (const OptionSpec& o : all) {
    CLI::Option* added = command.add_option_function<std::string>(
        "--" + o.name, [&args, name = o.name](const std::string& value) { args.options[name] = value; }, o.help);
    added->type_name(o.value_name);
    if (o.required) added->required();
  }
  for (const OptionSpec& f : flags)
    command
        .add_flag_callback(
            "--" + f.name, [&args, name = f.name] { args.flags.insert(name); }, f.help)
        ->disable_flag_override();  // a flag takes no value
  // Words no option takes are kept for check_no_unexpected, which names an unknown key as the config does.
  command.allow_extras();
  command.callback([&args, &command] { args.unexpected = command.remaining(); });
  for (const config::KeyDoc& key : config::config_key_docs())
    command
        .add_option_function<std::string>(
            "--" + key.name,
            [&args, name = key.name](const std::string& value) { args.overrides.emplace_back(name, value); },
            key.expects)
        ->type_name("VALUE")
        ->default_str(key.default_text.empty() ? "\"\"" : key.default_text)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->group(
            "Config keys (--section.key VALUE; a config file's values replace the defaults shown, the command "
            "line replaces both)");
}

void check_no_unexpected(const CommandArgs& a, const std::string& command) {
  if (a.unexpected.empty()) return;
  const std::string& word = a.unexpected.front();
  if (word.starts_with("--") && word.find('.') != std::string::npos) {
    config::TrainConfig scratch;  // names the key and the known ones when it is unknown
    const auto eq = word.find('=');
    config::apply_override(scratch, word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2), "");
  }
  throw InvalidArgument(fmt::format(
      "{}: unexpected argument '{}'; options look like --config FILE or --section.key value (`meshtrain {} --help` "
      "lists them)",
      command, word, command));
}

namespace {
// An option's value read by `parse` (std::stoll, std::stod) to its end, or
// `fallback` when not given; fails naming the option and what it wants.
template <typename T, typename Parse>
T parsed_option(const CommandArgs& a, const std::string& command, const std::string& key, T fallback, Parse parse,
                const char* wanted) {
  const auto it = a.options.find(key);
  if (it == a.options.end()) return fallback;
  size_t used = 0;
  T v{};
  try {
    v = parse(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MT_CHECK(used == it->second.size() && !it->second.empty(), "{}: --{} wants {}, got '{}'", command, key, wanted,
           it->second);
  return v;
}
}  // namespace

int64_t integer_option(const CommandArgs& a, const std::string& command, const std::string& key, int64_t fallback) {
  return parsed_option<int64_t>(
      a, command, key, fallback, [](const std::string& t, size_t* used) { return std::stoll(t, used); }, "an integer");
}

double number_option(const CommandArgs& a, const std::string& command, const std::string& key, double fallback) {
  return parsed_option<double>(
      a, command, key, fallback, [](const std::string& t, size_t* used) { return std::stod(t, used); }, "a number");
}

}  // namespace meshtrain::cli
