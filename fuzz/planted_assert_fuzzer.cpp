// Not a reader: a planted bug that proves the harness (fuzz_input.h). An
// input starting with 'C' fails an MT_CHECK, a clear rejection the fuzzer
// must accept; one starting with 'A' fails an MT_ASSERT, a broken invariant
// the fuzzer must report as a crash (the InternalError escapes
// expect_result_or_clear_error). Never fuzzed: scripts/fuzz.sh runs it on one
// input of each kind before it fuzzes anything.
#include "fuzz/fuzz_input.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char first = size > 0 ? static_cast<char>(data[0]) : '\0';
  fuzz::expect_result_or_clear_error([&] {
    MT_CHECK(first != 'C', "planted user error: the input starts with 'C'");
    MT_ASSERT(first != 'A', "planted internal error: the input starts with 'A'");
  });
  return 0;
}
