// What a model says about each of its parameters: shape and how it starts.
// Models own their initialisation; trainers only ask for the values.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"

namespace meshtrain::models {

struct ParameterInit {
  enum class Kind : uint8_t { normal, ones };
  Kind kind = Kind::normal;
  double std = 0.0;  // normal: mean 0, this standard deviation
};

struct ParameterSpec {
  Shape shape;
  ParameterInit init;
};

// Seeded initial f32 values, by name. The draws follow the names' order, so
// one config and seed give the same values on every machine and every run.
std::map<std::string, Tensor> initial_parameters(const std::map<std::string, ParameterSpec>& specs, uint64_t seed);

}  // namespace meshtrain::models
