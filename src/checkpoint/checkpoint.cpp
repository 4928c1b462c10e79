#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <regex>
#include <sstream>

#include "checkpoint/safetensors.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/hash.h"
#include "sharding/local_chunk.h"

namespace meshtrain::checkpoint {
namespace fs = std::filesystem;

namespace {
constexpr int kFormatVersion = 1;
// Version 2: tensors of pipeline stages carry "pipeline_rank" (only the ranks
// at that pp coordinate saved them); a reader of version 1 would miss it.
constexpr int kPipelineFormatVersion = 2;
constexpr const char* kFormat = "meshtrain checkpoint";
constexpr const char* kMetadataFile = "metadata.json";
constexpr const char* kMetadataChecksum = "metadata_fnv1a64";  // the last key: FNV-1a of the others

std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

int rank_of(const CheckpointRank& where) { return where.world ? where.world->rank() : 0; }
int ranks_of(const CheckpointRank& where) { return where.world ? where.world->size() : 1; }

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "cannot read checkpoint file {}: {}", path, std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  MT_CHECK(!in.bad(), "reading checkpoint file {} failed: {}", path, std::strerror(errno));
  return std::move(bytes).str();
}

uint64_t checksum_of(std::string_view bytes) { return fnv1a(bytes); }

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

// An integer of the metadata, exactly as written: get<> would truncate a
// fraction (1.5 as 1), wrap what does not fit (2^32 + 2 as the int 2) or, for
// a double out of range, be undefined. Another type is nlohmann's type error.
int64_t integer_field(const nlohmann::json& j, std::string_view what, int64_t lo = std::numeric_limits<int64_t>::min(),
                      int64_t hi = std::numeric_limits<int64_t>::max()) {
  MT_CHECK(!j.is_number() || j.is_number_integer(), "{} is {}, not an integer", what, j.dump());
  MT_CHECK(!j.is_number_unsigned() || j.get<uint64_t>() <= static_cast<uint64_t>(hi), "{} is {}, not in {}..{}", what,
           j.dump(), lo, hi);
  const auto v = j.get<int64_t>();
  MT_CHECK(v >= lo && v <= hi, "{} is {}, not in {}..{}", what, v, lo, hi);
  return v;
}

// N of a checkpoint folder's name step_N (6 to 18 digits), or none.
std::optional<int64_t> step_in_name(const std::string& base) {
  static const std::regex name(R"(step_(\d{6,18}))");
  std::smatch m;
  if (!std::regex_match(base, m, name)) return std::nullopt;
  return std::stoll(m[1].str());
}

// The global indices along every tensor dim that the rank at `coord` holds
// (every index with no mesh), in its local storage order.
std::vector<std::vector<int64_t>> held_indices(const Shape& shape, const sharding::Layout& layout,
                                               const sharding::DeviceMesh* mesh, const std::vector<int>& coord) {
  std::vector<std::vector<int64_t>> held(shape.rank());
  for (int d = 0; d < static_cast<int>(shape.rank()); ++d) {
    if (mesh == nullptr) {
      held[static_cast<size_t>(d)].resize(static_cast<size_t>(shape[d]));
      for (int64_t i = 0; i < shape[d]; ++i) held[static_cast<size_t>(d)][static_cast<size_t>(i)] = i;
    } else {
      held[static_cast<size_t>(d)] = sharding::shard_indices(shape[d], layout, d, *mesh, coord);
    }
  }
  return held;
}

// A replicated tensor is written once: by the ranks at coordinate 0 on
// every mesh dim it is replicated on. A pipeline stage's tensor, by those of
// the stage's ranks (at `pipeline_rank` on the first mesh dim) alone.
bool writes_piece(const sharding::Layout& layout, const std::vector<int>& coord, int pipeline_rank = -1) {
  for (size_t m = 0; m < layout.placements.size(); ++m) {
    if (m == 0 && pipeline_rank >= 0) {
      if (coord[0] != pipeline_rank) return false;
      continue;
    }
    if (layout.placements[m].is_replicate() && coord[m] != 0) return false;
  }
  return true;
}

// Copies from `from` (holding global indices `have` per dim) every element
// that `to` needs (`position[d][i]`: where global index i lies in `to` along
// dim d, or -1); returns how many. Runs contiguous in both are one memcpy.
int64_t copy_overlap(const Tensor& from, const std::vector<std::vector<int64_t>>& have, Tensor& to,
                     const std::vector<std::vector<int64_t>>& position) {
  const int rank = static_cast<int>(have.size());
  const size_t element = dtype_size(to.dtype());
  // Per dim, the (source, destination) positions of the indices both hold.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> pairs(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) {
    for (size_t k = 0; k < have[static_cast<size_t>(d)].size(); ++k) {
      const int64_t at = position[static_cast<size_t>(d)][static_cast<size_t>(have[static_cast<size_t>(d)][k])];
      if (at >= 0) pairs[static_cast<size_t>(d)].push_back({static_cast<int64_t>(k), at});
    }
    if (pairs[static_cast<size_t>(d)].empty()) return 0;
  }
  // Row-major strides (in elements) of both.
  std::vector<int64_t> from_stride(static_cast<size_t>(rank), 1), to_stride(static_cast<size_t>(rank), 1);
  for (int d = rank - 2; d >= 0; --d) {
    from_stride[static_cast<size_t>(d)] = from_stride[static_cast<size_t>(d) + 1] * from.shape()[d + 1];
    to_stride[static_cast<size_t>(d)] = to_stride[static_cast<size_t>(d) + 1] * to.shape()[d + 1];
  }
  const auto* src = static_cast<const std::byte*>(from.raw());
  auto* dst = static_cast<std::byte*>(to.raw());
  int64_t copied = 0;
  if (rank == 0) {
    std::memcpy(dst, src, element);
    return 1;
  }
  // The innermost dim's pairs as runs consecutive in both.
  std::vector<std::array<int64_t, 3>> runs;  // source, destination, length
  for (const auto& [s, t] : pairs.back()) {
    if (!runs.empty() && runs.back()[0] + runs.back()[2] == s && runs.back()[1] + runs.back()[2] == t)
      ++runs.back()[2];
    else
      runs.push_back({s, t, 1});
  }
  std::vector<size_t> at(static_cast<size_t>(rank - 1), 0);  // an odometer over the outer dims' pairs
  while (true) {
    int64_t src_base = 0, dst_base = 0;
    for (int d = 0; d + 1 < rank; ++d) {
      src_base += pairs[static_cast<size_t>(d)][at[static_cast<size_t>(d)]].first * from_stride[static_cast<size_t>(d)];
      dst_base += pairs[static_cast<size_t>(d)][at[static_cast<size_t>(d)]].second * to_stride[static_cast<size_t>(d)];
    }
    for (const auto& [s, t, n] : runs) {
      copy_bytes(dst + static_cast<size_t>(dst_base + t) * element, src + static_cast<size_t>(src_base + s) * element,
                 static_cast<size_t>(n) * element);
      copied += n;
    }
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++at[static_cast<size_t>(d)] < pairs[static_cast<size_t>(d)].size()) break;
      at[static_cast<size_t>(d)] = 0;
    }
    if (d < 0) break;
  }
  return copied;
}

}  // namespace

namespace {
// The lowest rank whose `failure` is set, or the world's size when none is (a collective).
int first_failed(const std::string& failure, comm::ProcessGroup* world) {
  if (world == nullptr) return failure.empty() ? 1 : 0;
  Tensor first = Tensor::empty({1}, DType::f64);
  first.data<double>()[0] = failure.empty() ? world->size() : world->rank();
  world->all_reduce(first, comm::ReduceOp::min)->wait();
  return static_cast<int>(first.data<double>()[0]);
}

void throw_failure(int failed, const std::string& failure, comm::ProcessGroup* world) {
  const int me = world ? world->rank() : 0;
  if (failed == (world ? world->size() : 1)) return;
  if (failed != me) {
    world->barrier()->wait();  // until the failing rank ends the job
    throw Error(fmt::format("rank {} failed to save or load a checkpoint (its error says why)", failed));
  }
  throw Error(failure);
}
}  // namespace

void fail_together(const std::string& failure, comm::ProcessGroup* world) {
  throw_failure(first_failed(failure, world), failure, world);
}

namespace {
void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// The mesh it was saved on; none when saved by one process.
std::optional<sharding::DeviceMesh> mesh_from(const nlohmann::json& m, const std::string& path) {
  if (m.at("shape").empty()) return std::nullopt;
  std::vector<int> shape;
  std::vector<std::string> names;
  for (const auto& s : m.at("shape"))
    shape.push_back(static_cast<int>(integer_field(s, "a mesh dim's size", 1, sharding::DeviceMesh::kMaxRanks)));
  for (const auto& n : m.at("names")) names.push_back(n.get<std::string>());
  try {
    return sharding::DeviceMesh(shape, names);
  } catch (const InternalError&) {
    throw;  // a bug, not a damaged checkpoint
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint {}: its mesh is not valid: {}", path, e.what()));
  }
}
}  // namespace

std::string checkpoint_folder_name(int64_t step) { return fmt::format("step_{:06d}", step); }

PendingCheckpoint begin_checkpoint(const std::string& folder, const CheckpointState& state,
                                   const std::vector<HeldTensor>& tensors, const CheckpointRank& where) {
  PendingCheckpoint save;
  save.folder = folder;
  save.final_path = (fs::path(folder) / checkpoint_folder_name(state.step)).string();
  save.partial = save.final_path + ".tmp";
  save.state = state;
  save.where = where;
  std::string failure;
  if (rank_of(where) == 0) {
    try {  // a partial folder of an earlier try goes
      fs::remove_all(save.partial);
      fs::create_directories(save.partial);
    } catch (const std::exception& e) {
      failure = fmt::format("cannot make checkpoint folder {}: {}", save.partial, e.what());
    }
  }
  for (const HeldTensor& t : tensors) {
    if (where.mesh != nullptr && t.layout.has_partial() && failure.empty())
      failure = fmt::format(
          "checkpoint: tensor '{}' is laid out {}, with a pending reduction: only finished values "
          "are saved",
          t.name, t.layout.to_string());
    MT_CHECK(t.pipeline_rank < 0 || (where.mesh && t.layout.placements.at(0).is_replicate()),
             "checkpoint: tensor '{}' of pipeline rank {} must be laid out Replicate over the mesh's first dim (pp)",
             t.name, t.pipeline_rank);
    save.described.push_back(
        {t.name, t.global_shape, t.local.dtype(), where.mesh ? t.layout.to_string() : "", t.pipeline_rank});
    if (where.mesh == nullptr || writes_piece(t.layout, where.coordinate, t.pipeline_rank))
      save.pieces[t.name] = t.local;
  }
  fail_together(failure, where.world);  // also: the folder exists before any rank writes into it
  return save;
}

void write_checkpoint_file(PendingCheckpoint& save) {
  const std::string file = (fs::path(save.partial) / rank_file_name(rank_of(save.where))).string();
  try {
    Fnv1a sum;  // of the bytes as they are written
    int64_t bytes = 0;
    save_safetensors(file, save.pieces, [&](std::string_view piece) {
      sum.add(piece);
      bytes += static_cast<int64_t>(piece.size());
    });
    save.file_bytes = bytes;
    save.checksum = sum.hash;
  } catch (const std::exception& e) {
    save.failure = fmt::format("writing checkpoint {} failed: {}", save.final_path, e.what());
  }
  save.pieces.clear();  // the snapshot's memory goes as soon as it is written
}

std::string complete_checkpoint(PendingCheckpoint& save) {
  const CheckpointRank& where = save.where;
  const int rank = rank_of(where), ranks = ranks_of(where);
  // Nothing of a failed save is left: the partial folder goes.
  const auto remove_partial_and_fail = [&] {
    const int failed = first_failed(save.failure, where.world);
    if (failed != ranks && rank == 0) {
      std::error_code ec;
      fs::remove_all(save.partial, ec);
    }
    throw_failure(failed, save.failure, where.world);
  };
  remove_partial_and_fail();
  Tensor record = Tensor::zeros({2}, DType::i64);  // bytes, checksum
  record.data<int64_t>()[0] = save.file_bytes;
  std::memcpy(&record.data<int64_t>()[1], &save.checksum, sizeof(save.checksum));
  Tensor records = Tensor::zeros({2 * ranks}, DType::i64);
  if (where.world)
    where.world->all_gather(record, records)->wait();
  else
    records = record;

  // Pipeline parallel: each rank describes its stages' tensors alone; rank 0
  // writes them all.
  const bool pipelined = !save.described.empty() && save.described.front().pipeline_rank >= 0;
  nlohmann::ordered_json described = nlohmann::ordered_json::object();
  auto describe = [&](const std::string& name, const Shape& shape, DType dtype, const std::string& layout, int pp) {
    described[name] = {{"shape", shape.dims()}, {"dtype", dtype_name(dtype)}, {"layout", layout}};
    if (pp >= 0) described[name]["pipeline_rank"] = pp;
  };
  if (pipelined && where.world) {
    nlohmann::json mine = nlohmann::json::array();
    for (const auto& t : save.described)
      mine.push_back({t.name, t.global_shape.dims(), dtype_name(t.dtype), t.layout, t.pipeline_rank});
    for (const std::string& text : comm::all_gather_text(*where.world, mine.dump()))
      for (const auto& t : nlohmann::json::parse(text))
        describe(t[0].get<std::string>(), Shape(t[1].get<std::vector<int64_t>>()), parse_dtype(t[2].get<std::string>()),
                 t[3].get<std::string>(), t[4].get<int>());
  } else {
    for (const auto& t : save.described) describe(t.name, t.global_shape, t.dtype, t.layout, t.pipeline_rank);
  }
  if (rank == 0) {
    try {
      nlohmann::ordered_json meta;
      meta["format"] = kFormat;
      meta["version"] = pipelined ? kPipelineFormatVersion : kFormatVersion;
      meta["step"] = save.state.step;
      meta["updates_applied"] = save.state.updates_applied;
      meta["data_cursor"] = save.state.data_cursor;
      meta["data_epoch"] = save.state.data_epoch;
      meta["data_shard_index"] = save.state.data_shard_index;
      meta["data_shard"] = save.state.data_shard;
      meta["trajectory"] = save.state.trajectory;
      meta["config"] = save.state.config;
      meta["run"] = save.state.run;
      meta["mesh"] =
          where.mesh ? nlohmann::ordered_json{{"shape", where.mesh->shape()}, {"names", where.mesh->names()}}
                     : nlohmann::ordered_json{{"shape", nlohmann::json::array()}, {"names", nlohmann::json::array()}};
      nlohmann::ordered_json files = nlohmann::ordered_json::array();
      for (int r = 0; r < ranks; ++r) {
        uint64_t sum = 0;
        std::memcpy(&sum, &records.data<int64_t>()[static_cast<size_t>(2 * r + 1)], sizeof(sum));
        files.push_back({{"file", rank_file_name(r)},
                         {"bytes", records.data<int64_t>()[static_cast<size_t>(2 * r)]},
                         {"fnv1a64", hex(sum)}});
      }
      meta["files"] = files;
      meta["tensors"] = described;
      meta[kMetadataChecksum] = hex(checksum_of(meta.dump()));  // of everything above, as dump() writes it
      write_file_atomically((fs::path(save.partial) / kMetadataFile).string(), meta.dump(1) + "\n");
      sync_directory(save.partial);
      // The rename marks it complete; a step saved before (a run resumed
      // from an earlier step) is replaced.
      if (fs::exists(save.final_path)) fs::remove_all(save.final_path);
      fs::rename(save.partial, save.final_path);
      sync_directory(save.folder);
    } catch (const std::exception& e) {
      save.failure = fmt::format("completing checkpoint {} failed: {}", save.final_path, e.what());
    }
  }
  remove_partial_and_fail();
  return save.final_path;
}

std::string save_checkpoint(const std::string& folder, const CheckpointState& state,
                            const std::vector<HeldTensor>& tensors, const CheckpointRank& where) {
  PendingCheckpoint save = begin_checkpoint(folder, state, tensors, where);
  write_checkpoint_file(save);
  return complete_checkpoint(save);
}

namespace {
// The complete checkpoints in `folder` (step_N with its metadata; a link is
// not a step this run saved), by step.
std::vector<std::pair<int64_t, fs::path>> complete_steps(const std::string& folder) {
  std::vector<std::pair<int64_t, fs::path>> complete;
  std::error_code ec;
  if (folder.empty() || !fs::is_directory(folder, ec)) return complete;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::optional<int64_t> step = step_in_name(entry.path().filename().string());
    if (step && !entry.is_symlink(ec) && fs::is_regular_file(entry.path() / kMetadataFile, ec))
      complete.emplace_back(*step, entry.path());
  }
  std::sort(complete.begin(), complete.end());
  return complete;
}
}  // namespace

std::optional<std::string> latest_checkpoint(const std::string& folder) {
  const auto complete = complete_steps(folder);
  if (complete.empty()) return std::nullopt;
  return complete.back().second.string();
}

std::vector<std::string> checkpoint_step_folders(const std::string& folder) {
  std::error_code ec;
  std::vector<std::string> steps;
  if (folder.empty() || !fs::is_directory(folder, ec)) return steps;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    if (step_in_name(entry.path().filename().string())) steps.push_back(entry.path().string());
  return steps;
}

std::string new_trajectory_id() {
  std::random_device entropy;
  const uint64_t id = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  return hex(id);
}

std::vector<int64_t> set_aside_steps_after(const std::string& folder, int64_t step, const std::string& aside) {
  std::vector<std::pair<int64_t, fs::path>> later = complete_steps(folder);
  std::erase_if(later, [&](const auto& s) { return s.first <= step; });
  std::vector<int64_t> moved;
  if (later.empty()) return moved;
  const fs::path into = fs::path(folder) / aside;
  std::error_code ec;
  fs::create_directories(into, ec);
  MT_CHECK(!ec, "cannot make {} to set aside the steps after {}: {}", into.string(), step, ec.message());
  for (const auto& [n, path] : later) {
    fs::rename(path, into / path.filename(), ec);
    MT_CHECK(!ec, "cannot move {} into {}: {}", path.string(), into.string(), ec.message());
    moved.push_back(n);
  }
  return moved;
}

namespace {
// metadata.json as it was written: its checksum over the other keys, in
// their order, matches (an edited step, layout or file checksum does not).
void check_metadata_checksum(const std::string& bytes) {
  nlohmann::ordered_json meta = nlohmann::ordered_json::parse(bytes);
  MT_CHECK(meta.contains(kMetadataChecksum),
           "it has no {} (saved by a meshtrain older than this one, or edited): it cannot be trusted",
           kMetadataChecksum);
  const std::string listed = meta.at(kMetadataChecksum).get<std::string>();
  meta.erase(kMetadataChecksum);
  MT_CHECK(hex(checksum_of(meta.dump())) == listed,
           "its contents do not match its {} (edited or damaged after it was written)", kMetadataChecksum);
}

// A folder step_N holds step N: a renamed or linked folder is not the step its name says.
void check_folder_name(const std::string& path, int64_t step) {
  const std::string base = fs::path(path).lexically_normal().filename().string();
  const std::optional<int64_t> named = step_in_name(base);
  MT_CHECK(!named || *named == step, "the folder {} holds step {} (renamed, or a link to another step)", base, step);
}
}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const std::string meta_path = (fs::path(path) / kMetadataFile).string();
  MT_CHECK(fs::is_regular_file(meta_path),
           "checkpoint {} is not complete: it has no {} (a save that did not finish; load another step)", path,
           kMetadataFile);
  CheckpointInfo info;
  info.path = path;
  try {
    const std::string bytes = read_file_bytes(meta_path);
    check_metadata_checksum(bytes);
    info.metadata = nlohmann::json::parse(bytes);
    const auto& m = info.metadata;
    check_folder_name(path, integer_field(m.at("step"), "step"));
    MT_CHECK(m.at("format").get<std::string>() == kFormat, "it is not a meshtrain checkpoint");
    const int64_t version = integer_field(m.at("version"), "version");
    MT_CHECK(version == kFormatVersion || version == kPipelineFormatVersion,
             "format version {} (this meshtrain reads {} and {})", version, kFormatVersion, kPipelineFormatVersion);
    info.state.step = integer_field(m.at("step"), "step");
    info.state.updates_applied = integer_field(m.at("updates_applied"), "updates_applied");
    info.state.data_cursor = integer_field(m.at("data_cursor"), "data_cursor");
    MT_CHECK(info.state.step >= 0 && info.state.updates_applied >= 0 && info.state.updates_applied <= info.state.step &&
                 info.state.data_cursor >= 0,
             "step {}, updates_applied {} or data_cursor {} is out of range", info.state.step,
             info.state.updates_applied, info.state.data_cursor);
    // The epoch and shard: absent in checkpoints saved before datasets of shards (one file: epoch 0, shard 0).
    if (m.contains("data_epoch")) info.state.data_epoch = integer_field(m.at("data_epoch"), "data_epoch");
    if (m.contains("data_shard_index"))
      info.state.data_shard_index = integer_field(m.at("data_shard_index"), "data_shard_index");
    MT_CHECK(info.state.data_epoch >= 0 && info.state.data_shard_index >= 0,
             "data_epoch {} or data_shard_index {} is out of range", info.state.data_epoch,
             info.state.data_shard_index);
    if (m.contains("data_shard")) {
      MT_CHECK(m.at("data_shard").is_string(), "data_shard is {}, not a string", m.at("data_shard").dump());
      info.state.data_shard = m.at("data_shard").get<std::string>();
    }
    info.state.trajectory = m.value("trajectory", "");
    MT_CHECK(info.state.trajectory.empty() || std::regex_match(info.state.trajectory, std::regex("[0-9a-f]{16}")),
             "its trajectory '{}' is not 16 hex digits", info.state.trajectory);
    info.state.config = m.at("config");
    const auto mesh = mesh_from(m.at("mesh"), path);
    const int ranks = mesh ? mesh->num_ranks() : 1;
    const auto& files = m.at("files");
    MT_CHECK(files.is_array() && static_cast<int>(files.size()) == ranks, "it lists {} files for a mesh of {} ranks",
             files.size(), ranks);
    for (size_t r = 0; r < files.size(); ++r) {
      MT_CHECK(files[r].at("file").get<std::string>() == rank_file_name(static_cast<int>(r)),
               "file {} is '{}', expected {}", r, files[r].at("file").get<std::string>(),
               rank_file_name(static_cast<int>(r)));
      const int64_t size = integer_field(files[r].at("bytes"), "a file's bytes");
      MT_CHECK(size >= 8, "file {} has {} bytes", r, size);
      MT_CHECK(std::regex_match(files[r].at("fnv1a64").get<std::string>(), std::regex("[0-9a-f]{16}")),
               "file {}'s checksum is not 16 hex digits", r);
    }
    for (const auto& [name, t] : m.at("tensors").items()) {
      for (const auto& s : t.at("shape"))
        MT_CHECK(integer_field(s, "a dim") >= 0, "tensor '{}' has a negative dim", name);
      parse_dtype(t.at("dtype").get<std::string>());
      if (mesh)
        sharding::Layout::parse(t.at("layout").get<std::string>(), mesh->ndim())
            .validate(static_cast<int>(t.at("shape").size()));
      if (t.contains("pipeline_rank")) {
        const int64_t pp = integer_field(t.at("pipeline_rank"), "pipeline_rank");
        MT_CHECK(
            version == kPipelineFormatVersion && mesh && pp >= 0 && pp < mesh->size(0) &&
                sharding::Layout::parse(t.at("layout").get<std::string>(), mesh->ndim()).placements[0].is_replicate(),
            "tensor '{}' has pipeline_rank {}, which its mesh and layout cannot hold", name, pp);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("checkpoint {}: {} is damaged: {}", path, meta_path, e.what()));
  } catch (const InternalError&) {
    throw;  // a bug, not a damaged checkpoint
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint {}: {}: {}", path, meta_path, e.what()));
  }
  return info;
}

void load_checkpoint(const CheckpointInfo& checkpoint, std::vector<HeldTensor>& tensors, const CheckpointRank& where) {
  const auto& m = checkpoint.metadata;
  const auto saved_mesh = mesh_from(m.at("mesh"), checkpoint.path);
  const bool saved_whole = !saved_mesh;
  std::string failure;
  std::exception_ptr bug;  // an InternalError, which is no damaged checkpoint: thrown as it is
  try {
    // What each target needs: where every global index lies in its piece.
    struct Need {
      HeldTensor* tensor;
      std::vector<std::vector<int64_t>> position;
      sharding::Layout saved_layout;
      int saved_pipeline_rank = -1;
      int64_t filled = 0;
    };
    std::vector<Need> needs;
    for (HeldTensor& t : tensors) {
      MT_CHECK(m.at("tensors").contains(t.name), "checkpoint {} holds no tensor '{}': it is of another model",
               checkpoint.path, t.name);
      const auto& saved = m.at("tensors").at(t.name);
      const std::vector<int64_t>& want = t.global_shape.dims();
      const auto shape = saved.at("shape").get<std::vector<int64_t>>();
      MT_CHECK(shape == want,
               "checkpoint {}: tensor '{}' has shape [{}], this run's is [{}]: the checkpoint is of "
               "another model shape",
               checkpoint.path, t.name, fmt::join(shape, ", "), fmt::join(want, ", "));
      const DType dtype = parse_dtype(saved.at("dtype").get<std::string>());
      MT_CHECK(dtype == t.local.dtype(),
               "checkpoint {}: tensor '{}' is {}, this run holds it as {} (was "
               "optimizer.state_dtype changed?)",
               checkpoint.path, t.name, dtype_name(dtype), dtype_name(t.local.dtype()));
      // No elements: nothing to read, and no index list as long as a dim
      // beside the empty one (metadata saying [0, 2^40] would allocate 2^40).
      if (t.global_shape.numel() == 0) continue;
      Need n{&t,
             {},
             saved_whole ? sharding::Layout{}
                         : sharding::Layout::parse(saved.at("layout").get<std::string>(), saved_mesh->ndim())};
      n.saved_pipeline_rank = saved.value("pipeline_rank", -1);
      const auto held = held_indices(t.global_shape, t.layout, where.mesh, where.coordinate);
      for (size_t d = 0; d < t.global_shape.rank(); ++d) {
        std::vector<int64_t> position(static_cast<size_t>(t.global_shape[d]), -1);
        const auto& h = held[d];
        for (size_t k = 0; k < h.size(); ++k) position[static_cast<size_t>(h[k])] = static_cast<int64_t>(k);
        n.position.push_back(std::move(position));
      }
      needs.push_back(std::move(n));
    }
    // Each saved file that holds something this rank needs, read once.
    const auto& files = m.at("files");
    for (int r = 0; r < (saved_whole ? 1 : saved_mesh->num_ranks()); ++r) {
      const std::vector<int> coord = saved_whole ? std::vector<int>{} : saved_mesh->coordinate(r);
      std::vector<Need*> from_here;
      for (Need& n : needs)
        if (saved_whole || writes_piece(n.saved_layout, coord, n.saved_pipeline_rank)) from_here.push_back(&n);
      if (from_here.empty()) continue;
      const std::string path = (fs::path(checkpoint.path) / rank_file_name(r)).string();
      const std::string bytes = read_file_bytes(path);
      const auto& listed = files[static_cast<size_t>(r)];
      MT_CHECK(static_cast<int64_t>(bytes.size()) == listed.at("bytes").get<int64_t>(),
               "checkpoint file {} has {} bytes, its metadata says {}: it is truncated or was replaced", path,
               bytes.size(), listed.at("bytes").get<int64_t>());
      MT_CHECK(hex(checksum_of(bytes)) == listed.at("fnv1a64").get<std::string>(),
               "checkpoint file {} is damaged: its checksum is {}, its metadata says {}", path, hex(checksum_of(bytes)),
               listed.at("fnv1a64").get<std::string>());
      const auto pieces = load_safetensors(path);
      for (Need* n : from_here) {
        HeldTensor& t = *n->tensor;
        const auto it = pieces.find(t.name);
        MT_CHECK(it != pieces.end(), "checkpoint file {} lacks tensor '{}', which its rank held", path, t.name);
        const auto have = held_indices(t.global_shape, n->saved_layout, saved_whole ? nullptr : &*saved_mesh, coord);
        std::vector<int64_t> piece_dims;  // the piece's shape as its layout gives it
        for (const auto& h : have) piece_dims.push_back(static_cast<int64_t>(h.size()));
        const Shape piece(piece_dims);
        MT_CHECK(it->second.shape() == piece && it->second.dtype() == t.local.dtype(),
                 "checkpoint file {}: tensor '{}' is {} {}, its layout says {} {}", path, t.name,
                 dtype_name(it->second.dtype()), it->second.shape().to_string(), dtype_name(t.local.dtype()),
                 piece.to_string());
        n->filled += copy_overlap(it->second, have, t.local, n->position);
      }
    }
    for (const Need& n : needs)
      MT_CHECK(n.filled == n.tensor->local.shape().numel(),
               "checkpoint {}: tensor '{}': {} of its {} elements here "
               "were found in the files",
               checkpoint.path, n.tensor->name, n.filled, n.tensor->local.shape().numel());
  } catch (const InternalError& e) {
    failure = e.what();
    bug = std::current_exception();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const int failed = first_failed(failure, where.world);
  if (bug && failed == rank_of(where)) std::rethrow_exception(bug);
  throw_failure(failed, failure, where.world);
}

std::map<std::string, Tensor> load_checkpoint_whole(const CheckpointInfo& checkpoint) {
  std::vector<HeldTensor> tensors;
  try {
    // The files hold every element once at least: metadata that says more
    // than they can hold is refused before anything that large is allocated.
    int64_t stored = 0, wanted = 0;
    for (const auto& f : checkpoint.metadata.at("files")) {
      const fs::path file = fs::path(checkpoint.path) / f.at("file").get<std::string>();
      std::error_code error;
      const auto size = fs::file_size(file, error);
      MT_CHECK(!error, "cannot read checkpoint file {}: {}", file.string(), error.message());
      stored += static_cast<int64_t>(size);
    }
    std::vector<std::pair<std::string, Shape>> shapes;
    for (const auto& [name, t] : checkpoint.metadata.at("tensors").items()) {
      shapes.emplace_back(name, Shape(t.at("shape").get<std::vector<int64_t>>()));
      wanted += shapes.back().second.numel() *
                static_cast<int64_t>(dtype_size(parse_dtype(t.at("dtype").get<std::string>())));
      MT_CHECK(wanted <= stored, "its tensors need more bytes than its files hold ({}): the metadata is damaged",
               stored);
    }
    for (const auto& [name, shape] : shapes)
      tensors.push_back(
          {name,
           shape,
           {},
           Tensor::empty(shape,
                         parse_dtype(checkpoint.metadata.at("tensors").at(name).at("dtype").get<std::string>()))});
  } catch (const InternalError&) {
    throw;  // a bug, not a damaged checkpoint
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint {}: {}", checkpoint.path, e.what()));
  }
  load_checkpoint(checkpoint, tensors, {});
  std::map<std::string, Tensor> whole;
  for (HeldTensor& t : tensors) whole[t.name] = std::move(t.local);
  return whole;
}

void keep_latest_checkpoints(const std::string& folder, int keep) {
  if (keep <= 0) return;
  const auto complete = complete_steps(folder);
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i) fs::remove_all(complete[i].second, ec);
}

}  // namespace meshtrain::checkpoint
