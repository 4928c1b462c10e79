#include "cli/fr_analyze_command.h"

#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/fr_analyze.h"

namespace meshtrain::cli {

Command add_fr_analyze_command(CLI::App& app) {
  struct FrOptions {
    std::string dir;
    bool json = false;
  };
  auto opts = std::make_shared<FrOptions>();
  CLI::App* fr =
      app.add_subcommand("fr-analyze",
                         "Read every rank's flight-recorder dump (fr_rank<R>.json, written on a collective timeout) "
                         "and name the first collective where ranks went out of step: the rank that never joined, "
                         "or ranks that disagree on op, dtype or size. Exit code 0: no mismatch; 1: mismatch found; "
                         "2: the dumps could not be read.");
  fr->add_option("dir", opts->dir, "Directory with the dumps")->required();
  fr->add_flag("--json", opts->json, "Print the report as JSON");

  return {fr, [opts] {
            const auto report = comm::analyze_flight_records(opts->dir);
            if (opts->json)
              fmt::print("{}\n", report.to_json().dump(1));
            else
              fmt::print("{}", report.to_text());
            return report.ok() ? 0 : 1;
          }};
}

}  // namespace meshtrain::cli
