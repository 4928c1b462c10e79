// libFuzzer target: a hardware profile (sched::parse_hardware, what
// `--hardware FILE` and `[schedule] hardware` read). A profile it accepts
// must cost every collective, size and group as a finite time >= 0, and
// give each rank a positive share of the device.
#include <cmath>
#include <numeric>

#include "fuzz/fuzz_input.h"
#include "sched/hardware.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(fuzz::as_text(data, size));
  fuzz::expect_result_or_clear_error([&] {
    const sched::HardwareProfile hw = sched::parse_hardware(text, "fuzz input");
    for (int world : {1, 2, 8, 64, 1024}) {
      const double share = hw.rank_share(world);
      fuzz::require(std::isfinite(share) && share > 0);
    }
    for (comm::OpType op :
         {comm::OpType::all_reduce, comm::OpType::all_gather, comm::OpType::reduce_scatter, comm::OpType::all_to_all}) {
      for (int ranks : {2, 3, 8, 16, 256}) {
        std::vector<int64_t> group(static_cast<size_t>(ranks));
        std::iota(group.begin(), group.end(), int64_t{0});
        for (double bytes : {0.0, 1.0, 4096.0, 1e6, 1e9, 1e12}) {
          const double us = hw.collective_us(op, bytes, group, 1024);
          fuzz::require(std::isfinite(us) && us >= 0);
        }
      }
    }
  });
  return 0;
}
