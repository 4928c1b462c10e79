// DeviceMesh: ranks laid out row-major in an N-d array with named dims.
// MeshGroups: the communication groups of a mesh (one per dim, and merged
// dims and further streams on demand), built collectively on a world group.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/process_group.h"

namespace meshtrain::sharding {

class DeviceMesh {
 public:
  // Far beyond any job, and small enough that rank numbers and counts fit an int.
  static constexpr int kMaxRanks = 1 << 24;

  // shape: ranks per dim (all >= 1, kMaxRanks in all at most); names:
  // unique, one per dim, or empty for "d0", "d1", ...
  explicit DeviceMesh(std::vector<int> shape, std::vector<std::string> names = {});

  int ndim() const { return static_cast<int>(shape_.size()); }
  int size(int dim) const;
  int num_ranks() const { return num_ranks_; }
  const std::vector<int>& shape() const { return shape_; }
  const std::vector<std::string>& names() const { return names_; }
  int dim_index(std::string_view name) const;
  std::vector<int> coordinate(int rank) const;  // row-major
  int rank_at(const std::vector<int>& coordinate) const;
  // The group of `rank` over `dims`: the ranks that share its coordinates on
  // the other dims, row-major over `dims` in the order given (int64, as the
  // lowered graph's and the cost model's groups list ranks).
  std::vector<int64_t> group_ranks(int rank, const std::vector<int>& dims) const;
  std::string describe() const;  // "(dp=2, tp=4)"
  bool operator==(const DeviceMesh&) const = default;

 private:
  std::vector<int> shape_;
  std::vector<std::string> names_;
  int num_ranks_ = 1;
};

// Parse "4,2" into a mesh shape.
std::vector<int> parse_mesh_shape(std::string_view text);

// The streams a mesh group's collectives run on: gradients' reduce_scatters
// on their own communicator (FSDP's reduce-scatter stream), so that the
// all_gathers that bring parameters do not queue behind them; everything
// else on the group's main one. Every rank issues each stream's collectives
// in one order; collectives of different streams may overlap.
enum class CommStream { main, reduce };
CommStream comm_stream(comm::OpType op);
const char* comm_stream_name(CommStream stream);

class MeshGroups {
 public:
  // Collective over `world` (size must equal the mesh's rank count): creates
  // one group per mesh dim: the ranks whose coordinates differ only there.
  MeshGroups(DeviceMesh mesh, comm::ProcessGroupPtr world);

  const DeviceMesh& mesh() const { return mesh_; }
  const std::vector<int>& coordinate() const { return coordinate_; }
  comm::ProcessGroup& dim_group(int dim) const;
  // The group over several mesh dims merged (group rank = row-major index
  // over `dims` in the given order). Created on first use: a collective over
  // the world, so every rank asks for the same dims in the same order.
  comm::ProcessGroup& merged_group(const std::vector<int>& dims, CommStream stream = CommStream::main);
  comm::ProcessGroup& world() const { return *world_; }

 private:
  comm::ProcessGroupPtr make_group(const std::vector<int>& dims, const std::string& name);

  DeviceMesh mesh_;
  comm::ProcessGroupPtr world_;
  std::vector<int> coordinate_;
  std::vector<comm::ProcessGroupPtr> dim_groups_;
  std::map<std::pair<std::vector<int>, CommStream>, comm::ProcessGroupPtr> merged_;
};

}  // namespace meshtrain::sharding
