#include "models/parameters.h"

#include <random>

namespace meshtrain::models {

std::map<std::string, Tensor> initial_parameters(const std::map<std::string, ParameterSpec>& specs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // One distribution for every parameter, each drawing with its own std: the
  // pair of normals the distribution makes at a time carries over between them.
  std::normal_distribution<float> normal;
  std::map<std::string, Tensor> out;
  for (const auto& [name, spec] : specs) {
    Tensor t = Tensor::empty(spec.shape, DType::f32);
    const std::normal_distribution<float>::param_type param(0.0f, static_cast<float>(spec.init.std));
    for (float& x : t.data<float>()) x = spec.init.kind == ParameterInit::Kind::ones ? 1.0f : normal(rng, param);
    out.emplace(name, std::move(t));
  }
  return out;
}

}  // namespace meshtrain::models
