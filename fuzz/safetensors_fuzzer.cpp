// libFuzzer target: a Hugging Face safetensors file (checkpoint::load_safetensors).
// A file it loads must be written back identically by save_safetensors.
#include <cstring>

#include "checkpoint/safetensors.h"
#include "fuzz/fuzz_input.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_input("input.safetensors", fuzz::as_text(data, size));
  fuzz::expect_result_or_clear_error([&] {
    const auto tensors = checkpoint::load_safetensors(path);
    const std::string copy = (fuzz::scratch_dir() / "copy.safetensors").string();
    checkpoint::save_safetensors(copy, tensors);
    const auto again = checkpoint::load_safetensors(copy);
    fuzz::require(again.size() == tensors.size());
    for (const auto& [name, t] : tensors) {
      const Tensor& u = again.at(name);
      fuzz::require(u.shape() == t.shape() && u.dtype() == t.dtype() && u.nbytes() == t.nbytes());
      fuzz::require(t.nbytes() == 0 || std::memcmp(u.raw(), t.raw(), t.nbytes()) == 0);
    }
  });
  return 0;
}
