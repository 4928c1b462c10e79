#include "cli/command_args.h"

#include "core/error.h"
#include "core/file_io.h"

namespace meshtrain::cli {

void write_text(const std::string& path, const std::string& text) { write_file_atomically(path, text); }

CommandArgs parse_args(const std::string& command, const std::vector<std::string>& args,
                       const std::set<std::string>& flags, const std::set<std::string>& options) {
  CommandArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      out.help = true;
      continue;
    }
    MT_CHECK(a.rfind("--", 0) == 0,
             "{}: unexpected argument '{}'; options look like --config FILE or --section.key value", command, a);
    std::string key = a.substr(2), value;
    if (flags.count(key)) {
      out.flags.insert(key);
      continue;
    }
    const auto eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    MT_CHECK(!flags.count(key), "{}: --{} is a flag and takes no value (give --{} alone)", command, key, key);
    // Options of the command, or config keys (section.key), which the config checks.
    if (key != "config" && !options.count(key) && key.find('.') == std::string::npos) {
      std::string known = "--config FILE";
      for (const auto& o : options) known += ", --" + o + " VALUE";
      for (const auto& f : flags) known += ", --" + f;
      throw InvalidArgument(
          fmt::format("{}: unknown option --{} ({} takes {}, and config keys as --section.key "
                      "value)",
                      command, key, command, known));
    }
    if (eq == std::string::npos) {
      MT_CHECK(i + 1 < args.size(), "{}: option --{} needs a value", command, key);
      value = args[++i];
    }
    if (key == "config" || options.count(key))
      out.options[key] = value;
    else
      out.overrides.emplace_back(key, value);
  }
  return out;
}

int64_t integer_option(const CommandArgs& a, const std::string& command, const std::string& key, int64_t fallback) {
  const auto it = a.options.find(key);
  if (it == a.options.end()) return fallback;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MT_CHECK(used == it->second.size() && !it->second.empty(), "{}: --{} wants an integer, got '{}'", command, key,
           it->second);
  return v;
}

}  // namespace meshtrain::cli
