#include "sharding/device_mesh.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "core/error.h"

namespace meshtrain::sharding {

DeviceMesh::DeviceMesh(std::vector<int> shape, std::vector<std::string> names)
    : shape_(std::move(shape)), names_(std::move(names)) {
  MT_CHECK(!shape_.empty(), "a device mesh needs at least one dimension");
  for (size_t d = 0; d < shape_.size(); ++d) {
    MT_CHECK(shape_[d] >= 1, "mesh dim {} has size {}; every mesh dim needs at least one rank", d, shape_[d]);
    MT_CHECK(shape_[d] <= kMaxRanks / num_ranks_, "mesh ({}) has more than {} ranks; a mesh may have at most that many",
             fmt::join(shape_, ", "), kMaxRanks);
    num_ranks_ *= shape_[d];
  }
  if (names_.empty())
    for (size_t d = 0; d < shape_.size(); ++d) names_.push_back(fmt::format("d{}", d));
  MT_CHECK(names_.size() == shape_.size(), "mesh of {} dims got {} names ({})", shape_.size(), names_.size(),
           fmt::join(names_, ", "));
  std::set<std::string> seen;
  for (const auto& n : names_) {
    MT_CHECK(!n.empty(), "mesh dim names must not be empty");
    MT_CHECK(seen.insert(n).second, "mesh dim name '{}' is used twice", n);
  }
}

int DeviceMesh::size(int dim) const {
  MT_CHECK(dim >= 0 && dim < ndim(), "mesh dim {} out of range for mesh {}", dim, describe());
  return shape_[dim];
}

int DeviceMesh::dim_index(std::string_view name) const {
  for (int d = 0; d < ndim(); ++d)
    if (names_[d] == name) return d;
  throw InvalidArgument(fmt::format("mesh {} has no dim named '{}'", describe(), name));
}

std::vector<int> DeviceMesh::coordinate(int rank) const {
  MT_CHECK(rank >= 0 && rank < num_ranks_, "rank {} is outside mesh {} of {} ranks", rank, describe(), num_ranks_);
  std::vector<int> c(shape_.size());
  for (int d = ndim() - 1; d >= 0; --d) {
    c[d] = rank % shape_[d];
    rank /= shape_[d];
  }
  return c;
}

int DeviceMesh::rank_at(const std::vector<int>& coordinate) const {
  MT_CHECK(static_cast<int>(coordinate.size()) == ndim(), "coordinate has {} entries for a {}-d mesh",
           coordinate.size(), ndim());
  int r = 0;
  for (int d = 0; d < ndim(); ++d) {
    MT_CHECK(coordinate[d] >= 0 && coordinate[d] < shape_[d], "coordinate {} outside mesh {}",
             fmt::join(coordinate, ","), describe());
    r = r * shape_[d] + coordinate[d];
  }
  return r;
}

std::vector<int64_t> DeviceMesh::group_ranks(int rank, const std::vector<int>& dims) const {
  MT_CHECK(rank >= 0 && rank < num_ranks_, "rank {} outside mesh {}", rank, describe());
  std::vector<int64_t> ranks{rank};
  for (int d : dims) {
    MT_CHECK(d >= 0 && d < ndim(), "mesh dim {} outside mesh {}", d, describe());
    std::vector<int64_t> next;
    for (int64_t r : ranks) {
      std::vector<int> c = coordinate(static_cast<int>(r));
      for (int i = 0; i < shape_[static_cast<size_t>(d)]; ++i) {
        c[static_cast<size_t>(d)] = i;
        next.push_back(rank_at(c));
      }
    }
    ranks = std::move(next);
  }
  return ranks;
}

std::string DeviceMesh::describe() const {
  std::vector<std::string> parts;
  for (int d = 0; d < ndim(); ++d) parts.push_back(fmt::format("{}={}", names_[d], shape_[d]));
  return fmt::format("({})", fmt::join(parts, ", "));
}

std::vector<int> parse_mesh_shape(std::string_view text) {
  std::vector<int> shape;
  for (int64_t v : parse_integer_list(text, "mesh shape")) {
    MT_CHECK(v >= 1 && v <= DeviceMesh::kMaxRanks, "mesh shape '{}': {} ranks along a dim is not in 1..{}", text, v,
             DeviceMesh::kMaxRanks);
    shape.push_back(static_cast<int>(v));
  }
  return shape;
}

MeshGroups::MeshGroups(DeviceMesh mesh, comm::ProcessGroupPtr world)
    : mesh_(std::move(mesh)), world_(std::move(world)) {
  MT_CHECK(world_->size() == mesh_.num_ranks(), "mesh {} has {} ranks but the world group has {}; run with -np {}",
           mesh_.describe(), mesh_.num_ranks(), world_->size(), mesh_.num_ranks());
  coordinate_ = mesh_.coordinate(world_->rank());
  for (int d = 0; d < mesh_.ndim(); ++d) dim_groups_.push_back(make_group({d}, mesh_.names()[d]));
}

comm::ProcessGroup& MeshGroups::dim_group(int dim) const {
  MT_CHECK(dim >= 0 && dim < mesh_.ndim(), "mesh dim {} out of range for mesh {}", dim, mesh_.describe());
  return *dim_groups_[dim];
}

CommStream comm_stream(comm::OpType op) {
  return op == comm::OpType::reduce_scatter ? CommStream::reduce : CommStream::main;
}

const char* comm_stream_name(CommStream stream) { return stream == CommStream::reduce ? "reduce" : "main"; }

comm::ProcessGroup& MeshGroups::merged_group(const std::vector<int>& dims, CommStream stream) {
  if (dims.size() == 1 && stream == CommStream::main) return dim_group(dims[0]);
  auto it = merged_.find({dims, stream});
  if (it != merged_.end()) return *it->second;
  std::vector<std::string> names;
  for (int d : dims) {
    MT_CHECK(d >= 0 && d < mesh_.ndim(), "mesh dim {} out of range for mesh {}", d, mesh_.describe());
    names.push_back(mesh_.names()[d]);
  }
  const std::string name = fmt::format("{}{}", fmt::join(names, "+"), stream == CommStream::reduce ? "/reduce" : "");
  auto group = make_group(dims, name);
  return *merged_.emplace(std::pair{dims, stream}, std::move(group)).first->second;
}

comm::ProcessGroupPtr MeshGroups::make_group(const std::vector<int>& dims, const std::string& name) {
  // Color: this rank's coordinate with `dims` zeroed; key: index over `dims`.
  std::vector<int> base = coordinate_;
  int key = 0;
  for (int d : dims) {
    key = key * mesh_.size(d) + coordinate_[d];
    base[d] = 0;
  }
  return world_->split(mesh_.rank_at(base), key, name);
}

}  // namespace meshtrain::sharding
