// libFuzzer target: a training config (config::load_config). The input up to
// its first NUL byte is the TOML file; after it, lines "section.key=value"
// are command-line overrides. A config it accepts must print and read back.
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "fuzz/fuzz_input.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = fuzz::as_text(data, size);
  const size_t nul = input.find('\0');
  const std::string path = fuzz::write_input("config.toml", input.substr(0, nul));
  std::vector<std::pair<std::string, std::string>> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = input.substr(nul + 1);
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      const std::string_view line = rest.substr(0, end);
      const size_t eq = line.find('=');
      if (eq != std::string_view::npos) overrides.emplace_back(line.substr(0, eq), line.substr(eq + 1));
      if (end == std::string_view::npos) break;
      rest.remove_prefix(end + 1);
    }
  }
  fuzz::expect_result_or_clear_error([&] {
    const config::TrainConfig config = config::load_config(path, overrides);
    fuzz::require(config.data.batch_size >= 1 && config.data.seq_len >= 1 && !config.data.path.empty());
  });
  return 0;
}
