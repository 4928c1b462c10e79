// Hugging Face safetensors files: an 8-byte little-endian header length, a
// JSON header {name: {dtype, shape, data_offsets}}, then the raw tensors.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace meshtrain::checkpoint {

// Every tensor of the file. Throws naming the file and what is wrong.
std::map<std::string, Tensor> load_safetensors(const std::string& path);
// Written to path.tmp, then renamed: a crash never leaves a half-written file.
// `written`, if given, sees every byte of the file in order as it goes out
// (a checksum without reading the file back).
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::function<void(std::string_view)>& written = {});

}  // namespace meshtrain::checkpoint
