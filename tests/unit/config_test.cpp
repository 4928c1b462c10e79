// The configuration reference page is the key table's, so it cannot drift.
#include "config/config.h"

#include <gtest/gtest.h>

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

}  // namespace
