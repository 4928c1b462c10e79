// libFuzzer target: the layout notation and what it means for one rank
// (sharding::parse_mesh_shape, Shape::parse, Layout::parse, local_chunk), as in
// `meshtrain layout --mesh M --shape S --placements P`. Input: "M|S|P".
// A layout it accepts must print and parse back to itself, and a rank's chunk
// must lie inside the tensor and, for a small dim, agree with shard_indices.
#include "fuzz/fuzz_input.h"
#include "sharding/local_chunk.h"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = fuzz::as_text(data, size);
  const size_t bar1 = input.find('|');
  if (bar1 == std::string_view::npos) return 0;
  const size_t bar2 = input.find('|', bar1 + 1);
  if (bar2 == std::string_view::npos) return 0;
  fuzz::expect_result_or_clear_error([&] {
    const sharding::DeviceMesh mesh(sharding::parse_mesh_shape(input.substr(0, bar1)));
    const Shape shape = Shape::parse(input.substr(bar1 + 1, bar2 - bar1 - 1));
    const auto layout = sharding::Layout::parse(input.substr(bar2 + 1), mesh.ndim());
    fuzz::require(sharding::Layout::parse(layout.to_string(), mesh.ndim()) == layout);
    const int rank = static_cast<int>(shape.rank());
    layout.validate(rank);
    for (int r : {0, mesh.num_ranks() / 2, mesh.num_ranks() - 1}) {
      const auto chunk = sharding::local_chunk(shape, layout, mesh, mesh.coordinate(r));
      fuzz::require(chunk.shape.rank() == shape.rank() && static_cast<int>(chunk.offset.size()) == rank);
      for (size_t d = 0; d < shape.rank(); ++d) {
        fuzz::require(chunk.shape[d] >= 0 && chunk.offset[d] >= 0 && chunk.offset[d] <= shape[d] &&
                      chunk.shape[d] <= shape[d] - chunk.offset[d]);
        if (shape[d] > 4096) continue;  // a small dim: the closed form against the list of indices
        const auto idx = sharding::shard_indices(shape[d], layout, static_cast<int>(d), mesh, mesh.coordinate(r));
        fuzz::require(chunk.shape[d] == static_cast<int64_t>(idx.size()) &&
                      chunk.offset[d] == (idx.empty() ? shape[d] : idx[0]));
      }
    }
  });
  return 0;
}
