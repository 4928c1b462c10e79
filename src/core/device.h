// Where a tensor's bytes live: host memory, or the memory of the CUDA device
// this process uses (one per process).
#pragma once

#include <cstdint>
#include <string_view>

namespace meshtrain {

enum class Device : uint8_t { cpu, cuda };

constexpr std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

}  // namespace meshtrain
