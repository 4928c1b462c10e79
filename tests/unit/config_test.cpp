// The configuration reference page is the key table's, so it cannot drift.
#include "config/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

TEST(ConfigReference, MatchesDocs) {
  const std::string expected = meshtrain::config::config_reference_markdown();
  std::ifstream in(std::string(MESHTRAIN_SOURCE_DIR) + "/docs/configuration.md");
  std::stringstream page;
  page << in.rdbuf();
  if (page.str() != expected) {
    std::ofstream("configuration.md") << expected;  // for scripts/config-reference.sh
    FAIL() << "docs/configuration.md differs from the config key table; run scripts/config-reference.sh";
  }
}

TEST(ConfigReference, ListsEveryKeyOnce) {
  const std::string page = meshtrain::config::config_reference_markdown();
  for (const std::string& key : meshtrain::config::config_keys()) {
    const std::string name = key.substr(key.find('.') + 1);
    const std::string section = "\n## [" + key.substr(0, key.find('.')) + "]\n";
    const size_t at = page.find(section);
    ASSERT_NE(at, std::string::npos) << key;
    const size_t row = page.find("| `" + name + "` |", at);
    ASSERT_NE(row, std::string::npos) << key;
    const size_t next_section = page.find("\n## ", at + 1);
    EXPECT_TRUE(next_section == std::string::npos || row < next_section) << key << " is not in its section";
  }
}

// A regression the config fuzzer found (fuzz/corpus/config/regression_string_escapes):
// config_values printed a string as it was between quotes, so a path holding a
// quote, a backslash or a control character printed as TOML that does not read
// (or reads as another path). Printed, every key reads back as the value it held.
TEST(ConfigValues, PrintAsTomlThatReadsBack) {
  using meshtrain::config::config_values;
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("meshtrain-config-test-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  { std::ofstream(dir + "/c.toml") << "[data]\npath = \"x\"\n"; }
  const meshtrain::config::TrainConfig c =
      meshtrain::config::load_config(dir + "/c.toml", {{"data.path", "a \"b\"\\q\tc\x01\x7f\xc3\xa9"},
                                                       {"checkpoint.folder", "\\\\server\\runs"},
                                                       {"optimizer.lr", "0.00012345678901234567"}});
  std::string text, section;
  for (const auto& [name, value] : config_values(c)) {
    const std::string key_section = name.substr(0, name.find('.'));
    if (key_section != section) text += "[" + (section = key_section) + "]\n";
    text += name.substr(name.find('.') + 1) + " = " + value + "\n";
  }
  { std::ofstream(dir + "/printed.toml") << text; }
  for (const auto& [name, value] : config_values(c)) {
    if (name == "data.path") {
      EXPECT_EQ(value, "\"a \\\"b\\\"\\\\q\\u0009c\\u0001\\u007F\xc3\xa9\"");
    }
  }
  meshtrain::config::TrainConfig back;
  ASSERT_NO_THROW(back = meshtrain::config::load_config(dir + "/printed.toml", {})) << text;
  EXPECT_EQ(back.data.path, c.data.path);
  EXPECT_EQ(back.checkpoint.folder, "\\\\server\\runs");
  EXPECT_EQ(back.optimizer.lr, c.optimizer.lr);
  EXPECT_EQ(config_values(back), config_values(c));
  std::filesystem::remove_all(dir);
}

}  // namespace
