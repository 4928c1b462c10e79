// libFuzzer target: what `meshtrain report` reads, a metrics file
// (report::parse_metrics_log) and run.json (report::parse_run_record), each
// rendered into a page when accepted. A page must be whole (it ends with
// </html>), hold no element from the input (every '<' of the input is
// escaped) and stay under 2 MB: every series is decimated.
#include "fuzz/fuzz_input.h"
#include "report/report.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(fuzz::as_text(data, size));
  auto check_page = [](const std::string& page) {
    fuzz::require(page.ends_with("</html>\n"));
    fuzz::require(page.find("<script") == std::string::npos && page.find("<x-fuzz") == std::string::npos);
    fuzz::require(page.size() < 2'000'000);  // the limit of any run's page
  };
  fuzz::expect_result_or_clear_error([&] {
    report::Run run;
    run.dir = "fuzz";
    run.metrics = report::parse_metrics_log(text, "fuzz input");
    check_page(report::render_report(run));
  });
  fuzz::expect_result_or_clear_error([&] {
    report::Run run;
    run.dir = "fuzz";
    run.record = report::parse_run_record(text, "fuzz input");
    fuzz::require(run.record->config_toml.size() <= text.size());
    check_page(report::render_report(run));
  });
  return 0;
}
