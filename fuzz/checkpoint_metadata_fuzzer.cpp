// libFuzzer target: the SEMANTIC fields of a checkpoint's metadata.json
// (layouts, steps, counts), where checkpoint_fuzzer.cpp fuzzes its bytes.
//
// Once, at start, four valid checkpoints are saved with
// checkpoint::save_checkpoint (the ranks of a mesh are local backend
// threads): on one process; on mesh [2] (a tensor sharded on dim 0 unevenly,
// one on dim 1, a strided shard, a replicated one, an empty one, a scalar);
// on mesh [2, 2] (two mesh dims on one tensor dim in either order, a strided
// shard under a shard); and a pipeline checkpoint (format version 2) on mesh
// [2, 2] (pp, dp) with tensors of each stage. Each input (FuzzedDataProvider)
// picks one and a sequence of semantic edits:
//   - step, updates_applied, the data cursor (data_cursor, data_epoch,
//     data_shard_index), version, format: interesting values
//     (0, -1, 2^31, 2^32 + n, 2^53 + 1, int64 and uint64 limits, n + 0.5, n as
//     a double, 1e300, the number as a string, null, true, [n], {}); or a new
//     step with updates_applied below it;
//   - a tensor's shape (a dim to another value, to 0, one more or one less
//     dim, not an array), dtype (one of another size, of the same size, a
//     PyTorch name, nonsense), layout (a placement per mesh dim from R, S(d),
//     _S(d, k), P(op), with or without [k] orders, dims in and out of range,
//     one placement too many or too few, arbitrary text), pipeline_rank;
//   - the tensors: drop one, copy one under a new name, rename one onto
//     another's name, swap two descriptions, move one to the end, replace one
//     by a value of another type;
//   - the mesh: a dim's size (interesting values), a dim added or removed, no
//     mesh, its names (renamed, repeated, empty, not strings); the rank count
//     (a mesh dim resized, the files list and the rank files following);
//   - the files list: entries swapped, dropped, duplicated, renamed, not
//     objects; the rank files on disk: swapped, duplicated, removed, one more;
//   - the rank files rewritten to agree with the metadata: a tensor saved
//     again under another layout (re-laid), every tensor saved again on
//     another mesh (re-meshed: [], [1], [2], [3], [4], [2, 2], [1, 3], [3, 1],
//     [2, 1, 2]), or the pieces of a tensor made what its edited description
//     (shape, dtype, layout, pipeline_rank, mesh) says each rank wrote;
//   - a top-level key dropped, of the wrong type, moved to the end; config
//     and run replaced;
// then reseals every checksum (each listed file's bytes and fnv1a64 from the
// file on disk, and metadata_fnv1a64 as checkpoint_fuzzer.cpp does), unless
// the input asks to damage a file's entry after the reseal or to leave the
// metadata's own checksum stale. The folder is named after the edited step
// (as the integer the reader would take it for) unless the input names it.
//
// The oracle. Any step may throw meshtrain::Error (a clear rejection); an
// internal error, another exception, a sanitizer report or a trap is a bug.
// Beyond that:
//  1. read_checkpoint_info accepts only what it can represent exactly: the
//     state's step, updates_applied and data cursor (data_cursor,
//     data_epoch, data_shard_index, data_shard) equal the metadata's
//     numbers (no fraction or out-of-range value truncated or wrapped); the
//     version is 1 or 2; every mesh dim is an integer in 1..2^24 and the
//     files list has their product of entries, each of an integer size; every
//     tensor dim is an integer >= 0; a pipeline_rank is an integer within the
//     mesh's first dim. Then latest_checkpoint finds the folder.
//  2. A whole load (load_checkpoint_whole) gives exactly the tensors the
//     metadata lists, each of the shape (numerically equal to the listed
//     numbers) and dtype it says.
//  3. The reference: from the edited metadata and the files now on disk the
//     fuzzer assembles each tensor itself, element by element: the ranks
//     that wrote a piece (every rank, less those at a coordinate > 0 on a
//     mesh dim of Replicate, less those off pipeline_rank on the first: what
//     save_checkpoint promises), each piece's global indices
//     (sharding::shard_indices: the layout's meaning), the piece taken from
//     the file only if the file exists, its entry's bytes and fnv1a64 match
//     it exactly and it holds the tensor with exactly that piece's shape and
//     dtype; every element counts the usable pieces that hold it (a piece
//     that fails those checks counts twice: never usable). A load that
//     succeeds must have every element it returns held exactly once and
//     equal, bitwise, to the reference: an accepted layout must not yield
//     values of other rows than the layout it claims places there, nor leave
//     an element unfilled or filled twice, nor take one from a file that does
//     not match its entry.
//  4. The strong check: a tensor whose description (shape, dtype, layout,
//     pipeline_rank) and mesh are as saved (or as a re-lay or re-mesh saved
//     it again) and whose rank files were not touched otherwise loads,
//     whenever its load succeeds, bitwise equal to the tensor saved.
//  5. A load into a target (checkpoint::load_checkpoint): one process, or
//     each rank of mesh [1], [2], [3], [4], [2, 2] or [1, 3] in turn (no
//     process group: each rank loads alone) with a layout per tensor drawn
//     by the input, for some or all of the listed tensors, must on success
//     give each rank sharding::local_piece of the reference (and of the
//     saved tensor, under 4.'s condition), every element held exactly once.
//  6. Edits that leave the checkpoint valid (a re-lay, a re-mesh; the step,
//     updates_applied and data cursor changed to other valid values with the
//     folder renamed to match; the config and run replaced; the mesh dims
//     renamed; keys reordered) must not be rejected: read, latest, whole and
//     target loads all succeed, equal to the tensors saved.
// With MESHTRAIN_FUZZ_VERBOSE set, the edited metadata and each rejection's
// message are printed (to see what an input does).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "comm/local_backend.h"
#include "core/hash.h"
#include "fuzz/fuzz_input.h"
#include "sharding/local_chunk.h"

using namespace meshtrain;
namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr int64_t kMaxReferenceElements = int64_t{1} << 16;
constexpr int64_t kMaxRewrittenElements = 4096;

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }
std::string rank_file(int r) { return fmt::format("rank_{:05d}.safetensors", r); }
json plain(const ojson& j) { return json::parse(j.dump()); }

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) __builtin_trap();  // the fuzzer's own files
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// Bytes from a seed: every element of every tensor distinct (almost surely),
// so a value from another row or another tensor shows.
Tensor pattern(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* b = static_cast<unsigned char*>(t.raw());
  uint64_t x = seed * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    b[i] = static_cast<unsigned char>(z ^ (z >> 31));
  }
  return t;
}

// A rank file: its bytes and the pieces it holds.
struct DiskFile {
  std::string bytes, checksum;
  std::map<std::string, Tensor> pieces;
  int origin = -1;  // the base's rank file it is, as saved; -1: rewritten by an edit
};

DiskFile rewritten(std::map<std::string, Tensor> pieces) {
  const fs::path path = fuzz::scratch_dir() / "rewritten.safetensors";
  checkpoint::save_safetensors(path.string(), pieces);
  DiskFile f;
  f.bytes = read_bytes(path);
  f.checksum = hex(fnv1a(f.bytes));
  f.pieces = std::move(pieces);
  return f;
}

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
  std::string layout;  // on the base's mesh ("" with none)
  int pipeline_rank = -1;
};

// A checkpoint saved once: its metadata and files as written, and the tensors saved.
struct Base {
  std::string folder_name;
  ojson metadata;
  std::vector<DiskFile> files;
  std::map<std::string, Tensor> globals;
};

Base make_base(const std::string& label, const std::optional<sharding::DeviceMesh>& mesh,
               const std::vector<Spec>& specs, int64_t step) {
  Base b;
  for (size_t i = 0; i < specs.size(); ++i)
    b.globals[specs[i].name] = pattern(Shape(specs[i].shape), specs[i].dtype, fnv1a(label) + i);
  const fs::path folder = fuzz::scratch_dir() / "bases" / label;
  fs::remove_all(folder);
  const checkpoint::CheckpointState state{step, step - 1, 4321, {{"model.dim", 5}}};
  std::string path;
  if (!mesh) {
    std::vector<checkpoint::HeldTensor> held;
    for (const Spec& s : specs) held.push_back({s.name, Shape(s.shape), {}, b.globals.at(s.name)});
    path = checkpoint::save_checkpoint(folder.string(), state, held, {});
  } else {
    comm::LocalWorld world(mesh->num_ranks());
    world.run([&](comm::ProcessGroup& pg) {
      const std::vector<int> coord = mesh->coordinate(pg.rank());
      std::vector<checkpoint::HeldTensor> held;
      for (const Spec& s : specs) {
        if (s.pipeline_rank >= 0 && coord[0] != s.pipeline_rank) continue;
        const auto layout = sharding::Layout::parse(s.layout, mesh->ndim());
        held.push_back({s.name, Shape(s.shape), layout,
                        sharding::local_piece(b.globals.at(s.name), layout, *mesh, coord), s.pipeline_rank});
      }
      const std::string saved = checkpoint::save_checkpoint(folder.string(), state, held, {&*mesh, coord, &pg});
      if (pg.rank() == 0) path = saved;
    });
  }
  b.folder_name = fs::path(path).filename().string();
  b.metadata = ojson::parse(read_bytes(fs::path(path) / "metadata.json"));
  for (int r = 0; r < (mesh ? mesh->num_ranks() : 1); ++r) {
    DiskFile f;
    f.bytes = read_bytes(fs::path(path) / rank_file(r));
    f.checksum = hex(fnv1a(f.bytes));
    f.pieces = checkpoint::load_safetensors((fs::path(path) / rank_file(r)).string());
    f.origin = r;
    b.files.push_back(std::move(f));
  }
  return b;
}

std::vector<Base>* bases = nullptr;

// ---- What a metadata says, read by the fuzzer --------------------------------

// j as an integer in [lo, hi], if it is one (an integral double included).
std::optional<int64_t> exact_int(const json& j, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (j.is_number_unsigned()) {
    if (j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    v = static_cast<int64_t>(j.get<uint64_t>());
  } else if (j.is_number_integer()) {
    v = j.get<int64_t>();
  } else if (j.is_number_float()) {
    const double d = j.get<double>();
    if (!(d >= -9.2e18 && d <= 9.2e18) || std::floor(d) != d) return std::nullopt;
    v = static_cast<int64_t>(d);
  } else {
    return std::nullopt;
  }
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

// The mesh a metadata's "mesh" describes (none: one process). Throws (an
// Error or a json exception) when it says nothing the fuzzer can use.
std::optional<sharding::DeviceMesh> mesh_of(const json& mj) {
  if (!mj.at("shape").is_array() || !mj.at("names").is_array()) throw Error("not a mesh");
  std::vector<int> shape;
  std::vector<std::string> names;
  for (const auto& s : mj["shape"]) {
    const auto n = exact_int(s, 1, 64);
    if (!n) throw Error("not a small mesh");
    shape.push_back(static_cast<int>(*n));
  }
  for (const auto& n : mj["names"]) names.push_back(n.get<std::string>());
  if (shape.empty()) return std::nullopt;
  return sharding::DeviceMesh(shape, names);
}

// A tensor's description, likewise.
struct Described {
  Shape shape;
  DType dtype;
  sharding::Layout layout;  // none with no mesh
  int pipeline_rank = -1;
};

Described describe(const json& t, const std::optional<sharding::DeviceMesh>& mesh) {
  if (!t.at("shape").is_array()) throw Error("not a shape");
  std::vector<int64_t> dims;
  for (const auto& s : t["shape"]) {
    const auto n = exact_int(s, 0, kMaxReferenceElements);
    if (!n) throw Error("not a small dim");
    dims.push_back(*n);
  }
  Described d{Shape(dims), parse_dtype(t.at("dtype").get<std::string>()), {}, -1};
  if (d.shape.numel() > kMaxReferenceElements) throw Error("too large");
  if (t.contains("pipeline_rank")) {
    const auto n = exact_int(t["pipeline_rank"], 0, 64);
    if (!n) throw Error("not a pipeline rank");
    d.pipeline_rank = static_cast<int>(*n);
  }
  if (mesh) {
    d.layout = sharding::Layout::parse(t.at("layout").get<std::string>(), mesh->ndim());
    d.layout.validate(static_cast<int>(d.shape.rank()));
    if (d.pipeline_rank >= 0 && (d.pipeline_rank >= mesh->size(0) || !d.layout.placements[0].is_replicate()))
      throw Error("not a pipeline layout");
  }
  return d;
}

// Whether the rank at `coord` wrote a piece of the tensor (save_checkpoint's
// rule): not at a coordinate > 0 on a mesh dim it is replicated on, and, of a
// pipeline stage's tensor, only at the stage's coordinate on the first.
bool writes(const sharding::Layout& layout, const std::vector<int>& coord, int pipeline_rank) {
  for (size_t d = 0; d < coord.size(); ++d) {
    if (d == 0 && pipeline_rank >= 0) {
      if (coord[0] != pipeline_rank) return false;
    } else if (layout.placements[d].is_replicate() && coord[d] != 0) {
      return false;
    }
  }
  return true;
}

// ---- Values ----------------------------------------------------------------

int64_t int_or(const ojson& j, int64_t fallback) { return j.is_number_integer() ? j.get<int64_t>() : fallback; }

// An interesting value for a field whose valid value is near `n`.
ojson interesting(FuzzedDataProvider& p, int64_t n) {
  n = std::clamp<int64_t>(n, -(int64_t{1} << 40), int64_t{1} << 40);
  const int64_t integers[] = {0,
                              1,
                              -1,
                              n,
                              n + 1,
                              n - 1,
                              int64_t{1} << 31,
                              (int64_t{1} << 32) + n,
                              -(int64_t{1} << 32) + n,
                              (int64_t{1} << 53) + 1,
                              std::numeric_limits<int64_t>::max(),
                              std::numeric_limits<int64_t>::min(),
                              p.ConsumeIntegralInRange<int64_t>(0, 8)};
  switch (p.ConsumeIntegralInRange(0, 11)) {
    case 0:
      return std::numeric_limits<uint64_t>::max();
    case 1:
      return uint64_t{1} << 63;
    case 2:
      return static_cast<double>(n) + 0.5;
    case 3:
      return static_cast<double>(n);
    case 4:
      return p.ConsumeBool() ? 1e300 : -1e300;
    case 5:
      return std::to_string(n);
    case 6:
      return p.ConsumeBool() ? ojson(nullptr) : ojson(true);
    case 7:
      return p.ConsumeBool() ? ojson::array({n}) : ojson::object();
    case 8:
      return p.ConsumeIntegral<int64_t>();
    default:
      return p.PickValueInArray(integers);
  }
}

// A layout for a mesh of mesh_ndim dims and a tensor of `rank` dims, mostly
// well formed; `valid` keeps to shards of existing dims and replicas.
std::string make_layout(FuzzedDataProvider& p, int mesh_ndim, int rank, bool valid) {
  if (!valid && p.ConsumeIntegralInRange(0, 15) == 15) {  // any text (printable: the metadata is UTF-8)
    std::string text = p.ConsumeRandomLengthString(24);
    for (char& c : text) c = static_cast<char>(' ' + static_cast<unsigned char>(c) % 95);
    return text;
  }
  int n = mesh_ndim;
  if (!valid && p.ConsumeIntegralInRange(0, 7) == 7) n += p.ConsumeBool() ? 1 : -1;
  const bool orders = p.ConsumeIntegralInRange(0, 3) == 3;
  std::string s;
  std::vector<int> order_of_dim(static_cast<size_t>(std::max(rank, 0)) + 2, 0);
  for (int m = 0; m < n; ++m) {
    const int kind = p.ConsumeIntegralInRange(0, valid ? 2 : 4);
    const int dim = valid ? (rank > 0 ? p.ConsumeIntegralInRange(0, rank - 1) : -1)
                          : p.ConsumeIntegralInRange(-1, std::max(rank, 0));
    if (kind == 0 || (valid && dim < 0)) {
      s += "R";
      continue;
    }
    if (kind == 1) s += fmt::format("S({})", dim);
    if (kind == 2) s += fmt::format("_S({}, {})", dim, p.ConsumeIntegralInRange(valid ? 2 : 0, 4));
    if (kind == 3) s += "P(sum)";
    if (kind == 4) s += "P(max)";
    if (orders && kind <= 2 && dim >= 0 && static_cast<size_t>(dim) < order_of_dim.size())
      s += fmt::format("[{}]", order_of_dim[static_cast<size_t>(dim)]++);
  }
  return s;
}

// ---- The edits ---------------------------------------------------------------

struct Edited {
  ojson meta;
  // The metadata of a valid checkpoint that the files hold: the base's, as
  // re-lays and re-meshes left it (valid only while files_valid).
  ojson valid;
  std::vector<std::optional<DiskFile>> files;  // rank_r on disk, or absent
  bool files_valid = true;                     // the files are those `valid` describes
  bool resealed = true;                        // every checksum made to match, none damaged after
  std::string folder;
};

std::string pick_key(FuzzedDataProvider& p, const ojson& obj) {
  if (!obj.is_object() || obj.empty()) return "";
  auto it = obj.begin();
  std::advance(it, p.ConsumeIntegralInRange<size_t>(0, obj.size() - 1));
  return it.key();
}

void edit_tensor(FuzzedDataProvider& p, ojson& meta) {
  ojson& tensors = meta.at("tensors");
  const std::string name = pick_key(p, tensors);
  if (name.empty()) return;
  ojson& t = tensors[name];
  const int mesh_ndim = meta.at("mesh").at("shape").is_array() ? static_cast<int>(meta["mesh"]["shape"].size()) : 1;
  const int rank =
      t.is_object() && t.contains("shape") && t["shape"].is_array() ? static_cast<int>(t["shape"].size()) : 1;
  switch (p.ConsumeIntegralInRange(0, 13)) {
    case 0:
    case 1: {  // a dim
      ojson& shape = t.at("shape");
      if (!shape.is_array() || shape.empty()) return;
      const size_t d = p.ConsumeIntegralInRange<size_t>(0, shape.size() - 1);
      const int64_t n = std::clamp<int64_t>(int_or(shape[d], 3), 0, 1 << 20);
      const int how = p.ConsumeIntegralInRange(0, 3);
      if (how == 0) shape[d] = interesting(p, n);
      if (how == 1) shape[d] = std::max<int64_t>(0, n + p.ConsumeIntegralInRange(-2, 2));
      if (how == 2) shape[d] = 0;
      if (how == 3) shape[d] = p.ConsumeIntegralInRange<int64_t>(0, 16);
      return;
    }
    case 2: {  // one more or one less dim, or not an array
      ojson& shape = t.at("shape");
      const int how = p.ConsumeIntegralInRange(0, 2);
      if (how == 0 && shape.is_array()) shape.push_back(p.ConsumeIntegralInRange(0, 3));
      if (how == 1 && shape.is_array() && !shape.empty()) shape.erase(shape.size() - 1);
      if (how == 2) shape = interesting(p, 3);
      return;
    }
    case 3: {
      static const char* const dtypes[] = {"f32", "bf16",    "f16",      "f8e4m3", "f8e5m2", "i32", "i64",
                                           "f64", "float32", "bfloat16", "int32",  "u8",     "",    "F32"};
      t.at("dtype") = p.PickValueInArray(dtypes);
      return;
    }
    case 4:
    case 5:
    case 6:
      t.at("layout") = make_layout(p, mesh_ndim, rank, false);
      return;
    case 7:
      if (p.ConsumeBool())
        t.erase("pipeline_rank");
      else
        t["pipeline_rank"] = p.ConsumeBool() ? ojson(p.ConsumeIntegralInRange(-1, 3)) : interesting(p, 1);
      return;
    case 8:
      tensors.erase(name);
      return;
    case 9: {
      ojson copy = t;
      tensors[name + (p.ConsumeBool() ? "_copy" : ".x")] = std::move(copy);
      return;
    }
    case 10: {  // renamed onto another's name (or a new one)
      const std::string other = p.ConsumeBool() ? pick_key(p, tensors) : name + "2";
      if (other.empty() || other == name) return;
      ojson moved = t;
      tensors.erase(name);
      tensors[other] = std::move(moved);
      return;
    }
    case 11: {  // two descriptions swapped
      const std::string other = pick_key(p, tensors);
      if (other.empty() || other == name) return;
      std::swap(tensors[name], tensors[other]);
      return;
    }
    case 12: {  // moved to the end: nothing changes
      ojson moved = t;
      tensors.erase(name);
      tensors[name] = std::move(moved);
      return;
    }
    default:
      t = interesting(p, 0);
      return;
  }
}

// Mesh dim d resized to n ranks, the files list and the rank files following.
void resize_world(FuzzedDataProvider& p, Edited& e, const Base& base) {
  ojson& mesh = e.meta.at("mesh");
  ojson& shape = mesh.at("shape");
  if (!shape.is_array()) return;
  const int n = p.ConsumeIntegralInRange(1, 4);
  if (shape.empty()) {
    shape.push_back(n);
    mesh["names"] = ojson::array({"dp"});
  } else {
    shape[p.ConsumeIntegralInRange<size_t>(0, shape.size() - 1)] = n;
  }
  int64_t ranks = 1;
  for (const auto& s : shape) {
    if (!s.is_number_integer() || s.get<int64_t>() < 1 || s.get<int64_t>() > 16) return;
    ranks *= s.get<int64_t>();
    if (ranks > 16) return;
  }
  ojson& files = e.meta.at("files");
  if (!files.is_array()) return;
  while (static_cast<int64_t>(files.size()) > ranks) files.erase(files.size() - 1);
  while (static_cast<int64_t>(files.size()) < ranks)
    files.push_back({{"file", rank_file(static_cast<int>(files.size()))}, {"bytes", 8}, {"fnv1a64", hex(0)}});
  e.files_valid = false;
  while (static_cast<int64_t>(e.files.size()) > ranks) e.files.pop_back();
  while (static_cast<int64_t>(e.files.size()) < ranks) {
    if (p.ConsumeBool())
      e.files.push_back(base.files[p.ConsumeIntegralInRange<size_t>(0, base.files.size() - 1)]);
    else
      e.files.emplace_back();
  }
}

// The pieces of the tensor `global` that each rank writes under `d` on
// `mesh` put into the rank files (made where missing), taken out of the
// others.
void write_pieces(Edited& e, const std::string& name, const Tensor& global, const Described& d,
                  const std::optional<sharding::DeviceMesh>& mesh) {
  const int ranks = mesh ? mesh->num_ranks() : 1;
  if (static_cast<int>(e.files.size()) < ranks) e.files.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    std::optional<DiskFile>& f = e.files[static_cast<size_t>(r)];
    const std::vector<int> coord = mesh ? mesh->coordinate(r) : std::vector<int>{};
    const bool writer = !mesh || writes(d.layout, coord, d.pipeline_rank);
    if (!f && !writer) continue;
    std::map<std::string, Tensor> pieces = f ? f->pieces : std::map<std::string, Tensor>{};
    if (writer)
      pieces[name] = mesh ? sharding::local_piece(global, d.layout, *mesh, coord) : global;
    else
      pieces.erase(name);
    f = rewritten(std::move(pieces));
  }
}

// A re-lay: a tensor saved again under another (valid) layout.
void relay(FuzzedDataProvider& p, Edited& e, const Base& base) {
  const std::string name = pick_key(p, e.valid.at("tensors"));
  const auto mesh = mesh_of(plain(e.valid.at("mesh")));
  if (name.empty() || !mesh || !e.files_valid) return;
  Described d = describe(plain(e.valid["tensors"][name]), mesh);
  const std::string text =
      (d.pipeline_rank >= 0 ? "R" : "") +
      make_layout(p, mesh->ndim() - (d.pipeline_rank >= 0 ? 1 : 0), static_cast<int>(d.shape.rank()), true);
  d.layout = sharding::Layout::parse(text, mesh->ndim());
  write_pieces(e, name, base.globals.at(name), d, mesh);
  e.valid["tensors"][name]["layout"] = text;
  if (e.meta.at("tensors").contains(name)) e.meta["tensors"][name].at("layout") = text;
}

// A re-mesh: every tensor saved again on another mesh, each under a layout of its own.
void remesh(FuzzedDataProvider& p, Edited& e, const Base& base) {
  static const std::vector<std::vector<int>> shapes = {{}, {1}, {2}, {3}, {4}, {2, 2}, {1, 3}, {3, 1}, {2, 1, 2}};
  static const std::vector<std::string> all_names = {"pp", "dp", "tp"};
  const std::vector<int>& shape = shapes[p.ConsumeIntegralInRange<size_t>(0, shapes.size() - 1)];
  const std::vector<std::string> names(all_names.begin(), all_names.begin() + static_cast<long>(shape.size()));
  std::optional<sharding::DeviceMesh> mesh;
  if (!shape.empty()) mesh.emplace(shape, names);
  e.files.clear();
  e.files_valid = true;
  for (const auto& [name, global] : base.globals) {
    ojson& t = e.valid.at("tensors").at(name);
    int pp = static_cast<int>(t.value("pipeline_rank", -1));
    std::string text;
    if (mesh) {
      if (pp >= 0) pp = std::min(pp, shape[0] - 1);
      text = (pp >= 0 ? "R" : "") +
             make_layout(p, mesh->ndim() - (pp >= 0 ? 1 : 0), static_cast<int>(global.shape().rank()), true);
    } else {
      pp = -1;
    }
    const Described d{global.shape(), global.dtype(),
                      mesh ? sharding::Layout::parse(text, mesh->ndim()) : sharding::Layout{}, pp};
    write_pieces(e, name, global, d, mesh);
    for (ojson* entry : {&t, e.meta.at("tensors").contains(name) ? &e.meta["tensors"][name] : nullptr}) {
      if (entry == nullptr || !entry->is_object()) continue;
      (*entry)["layout"] = text;
      if (pp >= 0)
        (*entry)["pipeline_rank"] = pp;
      else
        entry->erase("pipeline_rank");
    }
  }
  const int ranks = mesh ? mesh->num_ranks() : 1;
  e.files.resize(static_cast<size_t>(ranks));  // a rank that writes nothing still has its file
  for (auto& f : e.files)
    if (!f) f = rewritten({});
  ojson files = ojson::array();
  for (int r = 0; r < ranks; ++r) files.push_back({{"file", rank_file(r)}, {"bytes", 8}, {"fnv1a64", hex(0)}});
  const ojson mesh_json = {{"shape", shape}, {"names", mesh ? names : std::vector<std::string>{}}};
  for (ojson* m : {&e.meta, &e.valid}) {
    (*m)["mesh"] = mesh_json;
    (*m)["files"] = files;
  }
}

// The pieces of a tensor made what its (edited) description says each rank
// wrote: the tensor saved if that description is as saved, else new values.
void conform(FuzzedDataProvider& p, Edited& e, const Base& base) {
  const json m = plain(e.meta);
  const std::string name = pick_key(p, e.meta.at("tensors"));
  if (name.empty()) return;
  const auto mesh = mesh_of(m.at("mesh"));
  const Described d = describe(m["tensors"][name], mesh);
  if (d.shape.numel() > kMaxRewrittenElements) return;
  const json valid = plain(e.valid);
  const bool as_saved =
      valid["tensors"].contains(name) && valid["tensors"][name] == m["tensors"][name] && valid["mesh"] == m["mesh"];
  write_pieces(e, name, as_saved ? base.globals.at(name) : pattern(d.shape, d.dtype, fnv1a(name) + 99), d, mesh);
  e.files_valid = e.files_valid && as_saved;
}

void apply_edit(FuzzedDataProvider& p, Edited& e, const Base& base) {
  ojson& meta = e.meta;
  switch (p.ConsumeIntegralInRange(0, 23)) {
    case 0:
      meta["step"] = interesting(p, int_or(meta["step"], 1));
      return;
    case 1:
      meta["updates_applied"] = interesting(p, int_or(meta["updates_applied"], 0));
      return;
    case 2: {
      const char* key = p.PickValueInArray({"data_cursor", "data_epoch", "data_shard_index"});
      meta[key] = interesting(p, int_or(meta[key], 0));
      return;
    }
    case 3:
      meta["version"] = p.ConsumeBool() ? ojson(p.ConsumeIntegralInRange(0, 3)) : interesting(p, 1);
      return;
    case 4:
      meta["format"] = p.ConsumeBool() ? "meshtrain checkpoint " : "Meshtrain checkpoint";
      return;
    case 5:
    case 6:
    case 7:
    case 8:
      edit_tensor(p, meta);
      return;
    case 9: {  // a mesh dim's size, a dim more or less, no mesh
      ojson& shape = meta.at("mesh").at("shape");
      if (!shape.is_array()) return;
      ojson& names = meta["mesh"]["names"];
      const int how = p.ConsumeIntegralInRange(0, 3);
      if (how == 0 && !shape.empty()) shape[p.ConsumeIntegralInRange<size_t>(0, shape.size() - 1)] = interesting(p, 2);
      if (how == 1) {
        shape.push_back(p.ConsumeIntegralInRange(0, 2));
        names.push_back(p.ConsumeBool() ? "extra" : "dp");
      }
      if (how == 2 && !shape.empty()) {
        shape.erase(shape.size() - 1);
        if (names.is_array() && !names.empty()) names.erase(names.size() - 1);
      }
      if (how == 3) meta["mesh"] = {{"shape", ojson::array()}, {"names", ojson::array()}};
      return;
    }
    case 10: {  // the mesh's names
      ojson& names = meta.at("mesh").at("names");
      if (!names.is_array() || names.empty()) return;
      const size_t i = p.ConsumeIntegralInRange<size_t>(0, names.size() - 1);
      static const char* const others[] = {"dp", "tp", "pp", "dp_shard", "cp", "", "x"};
      const int how = p.ConsumeIntegralInRange(0, 3);
      if (how == 0) names[i] = p.PickValueInArray(others);
      if (how == 1) names[i] = interesting(p, 0);
      if (how == 2) names[i] = ojson(names[p.ConsumeIntegralInRange<size_t>(0, names.size() - 1)]);
      if (how == 3) names[i] = fmt::format("renamed{}", p.ConsumeIntegralInRange(0, 9));
      return;
    }
    case 11:
      resize_world(p, e, base);
      return;
    case 12: {  // the files list
      ojson& files = meta.at("files");
      if (!files.is_array() || files.empty()) return;
      const size_t i = p.ConsumeIntegralInRange<size_t>(0, files.size() - 1);
      const size_t j = p.ConsumeIntegralInRange<size_t>(0, files.size() - 1);
      const int how = p.ConsumeIntegralInRange(0, 4);
      if (how == 0) std::swap(files[i], files[j]);
      if (how == 1) files.erase(i);
      if (how == 2) files.push_back(ojson(files[i]));
      if (how == 3) files[i]["file"] = rank_file(p.ConsumeIntegralInRange(0, 4));
      if (how == 4) files[i] = interesting(p, 0);
      return;
    }
    case 13:
    case 14: {  // the rank files on disk
      if (e.files.empty()) return;
      const size_t i = p.ConsumeIntegralInRange<size_t>(0, e.files.size() - 1);
      const size_t j = p.ConsumeIntegralInRange<size_t>(0, e.files.size() - 1);
      const int how = p.ConsumeIntegralInRange(0, 3);
      if (how == 0) std::swap(e.files[i], e.files[j]);
      if (how == 1) e.files[i] = std::optional<DiskFile>(e.files[j]);
      if (how == 2) e.files[i].reset();
      if (how == 3 && e.files.size() < 6)
        e.files.push_back(base.files[p.ConsumeIntegralInRange<size_t>(0, base.files.size() - 1)]);
      e.files_valid = e.files_valid && how < 2 && i == j;
      return;
    }
    case 15: {  // a top-level key
      static const char* const keys[] = {
          "format", "version", "step",    "updates_applied", "data_cursor",      "config",    "run",
          "mesh",   "files",   "tensors", "data_epoch",      "data_shard_index", "data_shard"};
      const std::string key = p.PickValueInArray(keys);
      const int how = p.ConsumeIntegralInRange(0, 2);
      if (how == 0) meta.erase(key);
      if (how == 1) meta[key] = interesting(p, 0);
      if (how == 2) {  // moved to the end: nothing changes
        ojson moved = meta[key];
        meta.erase(key);
        meta[key] = std::move(moved);
      }
      return;
    }
    case 16:
      meta[p.ConsumeBool() ? "config" : "run"] =
          p.ConsumeBool() ? ojson{{"model.dim", p.ConsumeIntegral<int>()}} : interesting(p, 0);
      return;
    case 17: {  // a new step, updates_applied below it
      const int64_t step = p.ConsumeIntegralInRange<int64_t>(0, p.ConsumeBool() ? 999999999999999999 : 40);
      meta["step"] = step;
      meta["updates_applied"] = p.ConsumeIntegralInRange<int64_t>(0, step);
      return;
    }
    case 18: {
      meta["data_cursor"] = p.ConsumeIntegralInRange<int64_t>(0, std::numeric_limits<int64_t>::max());
      meta["data_epoch"] = p.ConsumeIntegralInRange<int64_t>(0, std::numeric_limits<int64_t>::max());
      meta["data_shard_index"] = p.ConsumeIntegralInRange<int64_t>(0, std::numeric_limits<int64_t>::max());
      std::string shard = p.ConsumeRandomLengthString(16);
      for (char& c : shard) c = static_cast<char>(c & 0x7f);  // JSON text is UTF-8: the dump below needs it
      meta["data_shard"] = shard;
      return;
    }
    case 19:
    case 20:
      relay(p, e, base);
      return;
    case 21:
      remesh(p, e, base);
      return;
    default:
      conform(p, e, base);
      return;
  }
}

// Every listed file's bytes and fnv1a64 from the file on disk, then the
// metadata's own checksum (the last key).
void reseal(FuzzedDataProvider& p, Edited& e, const Base& base) {
  ojson& files = e.meta["files"];
  if (files.is_array()) {
    for (auto& f : files) {
      if (!f.is_object() || !f.contains("file") || !f["file"].is_string()) continue;
      for (size_t r = 0; r < e.files.size(); ++r)
        if (f["file"] == rank_file(static_cast<int>(r)) && e.files[r]) {
          f["bytes"] = e.files[r]->bytes.size();
          f["fnv1a64"] = e.files[r]->checksum;
        }
    }
    if (!files.empty() && p.ConsumeIntegralInRange(0, 15) == 15) {  // a file's entry damaged after the reseal
      e.resealed = false;
      ojson& f = files[p.ConsumeIntegralInRange<size_t>(0, files.size() - 1)];
      if (f.is_object()) {
        if (p.ConsumeBool())
          f["bytes"] = p.ConsumeBool() ? interesting(p, int_or(f["bytes"], 100)) : ojson(int_or(f["bytes"], 100) + 0.5);
        else
          f["fnv1a64"] = base.files[p.ConsumeIntegralInRange<size_t>(0, base.files.size() - 1)].checksum;
      }
    }
  }
  if (p.ConsumeIntegralInRange(0, 63) == 63) {  // the metadata's checksum left as it was
    e.resealed = false;
    return;
  }
  e.meta.erase("metadata_fnv1a64");
  e.meta["metadata_fnv1a64"] = hex(fnv1a(e.meta.dump()));
}

// The folder: named after the step as the reader would take it (if it can
// be a folder name), or as saved, or a step of the input's choice.
std::string folder_name(FuzzedDataProvider& p, const Edited& e, const Base& base) {
  const int how = p.ConsumeIntegralInRange(0, 3);
  if (how == 2) return base.folder_name;
  if (how == 3) return checkpoint::checkpoint_folder_name(p.ConsumeIntegralInRange<int64_t>(0, 20));
  const ojson step = e.meta.contains("step") ? e.meta["step"] : ojson();
  if (step.is_number_integer() && step.get<int64_t>() >= 0 && step.get<int64_t>() < 1000000000000000000)
    return checkpoint::checkpoint_folder_name(step.get<int64_t>());
  if (step.is_number_float() && step.get<double>() >= 0 && step.get<double>() < 1e18)
    return checkpoint::checkpoint_folder_name(static_cast<int64_t>(step.get<double>()));
  return base.folder_name;
}

// ---- The oracle --------------------------------------------------------------

// Oracle 6's condition: the edits left a valid checkpoint.
bool valid_edits_only(const json& m, const Edited& e) {
  if (!e.resealed || !e.files_valid) return false;
  const json valid = plain(e.valid);
  json a = m, b = valid;
  for (const char* key : {"step", "updates_applied", "data_cursor", "data_epoch", "data_shard_index", "data_shard",
                          "config", "run", "files", "metadata_fnv1a64"}) {
    if (!a.contains(key)) return false;
    a.erase(key);
    b.erase(key);
  }
  if (!a["mesh"].is_object() || !a["mesh"].contains("names")) return false;
  const json names = a["mesh"]["names"];
  a["mesh"].erase("names");
  b["mesh"].erase("names");
  if (a.dump() != b.dump()) return false;  // 2.0 is not the 2 it was saved as
  // The files list: one entry per rank, each file there and as listed.
  json files = json::array();
  for (size_t r = 0; r < e.files.size(); ++r) {
    if (!e.files[r]) return false;
    files.push_back({{"file", rank_file(static_cast<int>(r))},
                     {"bytes", e.files[r]->bytes.size()},
                     {"fnv1a64", e.files[r]->checksum}});
  }
  if (m["files"].dump() != files.dump() || valid["files"].size() != files.size()) return false;
  const auto step = exact_int(m["step"], 0, 999999999999999999);
  if (!m["step"].is_number_integer() || !m["updates_applied"].is_number_integer() ||
      !m["data_cursor"].is_number_integer() || !step)
    return false;
  const auto updates = exact_int(m["updates_applied"], 0, *step);
  const auto cursor = exact_int(m["data_cursor"], 0, std::numeric_limits<int64_t>::max());
  for (const char* key : {"data_epoch", "data_shard_index"})
    if (!m[key].is_number_integer() || !exact_int(m[key], 0, std::numeric_limits<int64_t>::max())) return false;
  if (!m["data_shard"].is_string()) return false;
  if (!updates || !cursor || e.folder != checkpoint::checkpoint_folder_name(*step)) return false;
  const json& valid_names = valid["mesh"]["names"];
  if (valid_names.empty()) return names == valid_names;
  if (!names.is_array() || names.size() != valid_names.size()) return false;
  std::set<std::string> seen;
  for (const auto& n : names)
    if (!n.is_string() || n.get<std::string>().empty() || !seen.insert(n.get<std::string>()).second) return false;
  return true;
}

// Oracle 4's condition: the tensor's description and the mesh are as saved
// (or saved again), and so are the files.
bool as_saved(const json& m, const std::string& name, const Edited& e) {
  const json valid = plain(e.valid);
  return e.files_valid && valid["tensors"].contains(name) && m.at("tensors").at(name) == valid["tensors"][name] &&
         m.at("mesh") == valid["mesh"];
}

// Oracle 1.
void check_info(const checkpoint::CheckpointInfo& info, const json& m) {
  fuzz::require(json(info.state.step) == m.at("step"));
  fuzz::require(json(info.state.updates_applied) == m.at("updates_applied"));
  fuzz::require(json(info.state.data_cursor) == m.at("data_cursor"));
  fuzz::require(json(info.state.data_epoch) == m.value("data_epoch", json(0)));
  fuzz::require(json(info.state.data_shard_index) == m.value("data_shard_index", json(0)));
  fuzz::require(json(info.state.data_shard) == m.value("data_shard", json("")));
  fuzz::require(m.at("version") == 1 || m.at("version") == 2);
  int64_t ranks = 1;
  const json& mesh_shape = m.at("mesh").at("shape");
  for (const auto& s : mesh_shape) {
    const auto n = exact_int(s, 1, sharding::DeviceMesh::kMaxRanks);
    fuzz::require(n.has_value());
    ranks *= *n;
    fuzz::require(ranks <= sharding::DeviceMesh::kMaxRanks);
  }
  fuzz::require(m.at("files").is_array() && static_cast<int64_t>(m["files"].size()) == ranks);
  for (const auto& f : m["files"])
    fuzz::require(exact_int(f.at("bytes"), 8, std::numeric_limits<int64_t>::max()).has_value());
  for (const auto& [name, t] : m.at("tensors").items()) {
    for (const auto& s : t.at("shape")) fuzz::require(exact_int(s, 0, std::numeric_limits<int64_t>::max()).has_value());
    if (t.contains("pipeline_rank")) {
      fuzz::require(!mesh_shape.empty());
      const auto first = exact_int(*mesh_shape.begin(), 1, sharding::DeviceMesh::kMaxRanks);
      fuzz::require(first && exact_int(t["pipeline_rank"], 0, *first - 1));
    }
  }
}

// Oracle 3: the tensor as the edited metadata and the files on disk say,
// with how many usable pieces hold each element; none where the fuzzer
// cannot read the description (then only the other checks apply).
struct Reference {
  Tensor value;
  Tensor held;  // i32: usable pieces holding each element (a piece that fails its checks counts 2)
};

std::optional<Reference> reference(const json& m, const std::string& name, const Edited& e) {
  try {
    const auto mesh = mesh_of(m.at("mesh"));
    const Described d = describe(m.at("tensors").at(name), mesh);
    const json& files = m.at("files");
    Reference ref{Tensor::zeros(d.shape, d.dtype), Tensor::zeros(d.shape, DType::i32)};
    const size_t element = dtype_size(d.dtype);
    auto* value = static_cast<std::byte*>(ref.value.raw());
    auto held = ref.held.data<int32_t>();
    const size_t rank = d.shape.rank();
    for (int r = 0; r < (mesh ? mesh->num_ranks() : 1); ++r) {
      const std::vector<int> coord = mesh ? mesh->coordinate(r) : std::vector<int>{};
      if (mesh && !writes(d.layout, coord, d.pipeline_rank)) continue;
      std::vector<std::vector<int64_t>> idx(rank);
      std::vector<int64_t> piece_dims;
      for (size_t k = 0; k < rank; ++k) {
        if (mesh) {
          idx[k] = sharding::shard_indices(d.shape[k], d.layout, static_cast<int>(k), *mesh, coord);
        } else {
          for (int64_t i = 0; i < d.shape[k]; ++i) idx[k].push_back(i);
        }
        piece_dims.push_back(static_cast<int64_t>(idx[k].size()));
      }
      const Shape piece_shape(piece_dims);
      // The piece, if its file is there, matches its entry and holds it as its layout says.
      const Tensor* piece = nullptr;
      const auto rr = static_cast<size_t>(r);
      if (rr < e.files.size() && e.files[rr] && files.is_array() && rr < files.size() && files[rr].is_object() &&
          files[rr].value("file", json()) == rank_file(r) &&
          files[rr].value("bytes", json()) == json(e.files[rr]->bytes.size()) &&
          files[rr].value("fnv1a64", json()) == e.files[rr]->checksum) {
        const auto it = e.files[rr]->pieces.find(name);
        if (it != e.files[rr]->pieces.end() && it->second.shape() == piece_shape && it->second.dtype() == d.dtype)
          piece = &it->second;
      }
      std::vector<int64_t> at(rank, 0);
      for (int64_t k = 0; k < piece_shape.numel(); ++k) {
        int64_t flat = 0;
        for (size_t j = 0; j < rank; ++j) flat = flat * d.shape[j] + idx[j][static_cast<size_t>(at[j])];
        held[static_cast<size_t>(flat)] += piece ? 1 : 2;
        if (piece)
          std::memcpy(value + static_cast<size_t>(flat) * element,
                      static_cast<const std::byte*>(piece->raw()) + static_cast<size_t>(k) * element, element);
        for (size_t j = rank; j-- > 0;) {
          if (++at[j] < piece_dims[j]) break;
          at[j] = 0;
        }
      }
    }
    return ref;
  } catch (const json::exception&) {
    return std::nullopt;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// fuzz::expect_result_or_clear_error, saying whether `body` ran through; with
// MESHTRAIN_FUZZ_VERBOSE set, the error of a rejection is printed.
template <typename Body>
bool attempt(const char* what, Body&& body) {
  try {
    body();
    return true;
  } catch (const Error& e) {
    if (std::getenv("MESHTRAIN_FUZZ_VERBOSE")) fmt::print(stderr, "{}: {}\n", what, e.what());
    return false;
  }
}

bool each_held_once(const Tensor& held) {
  for (int32_t n : held.data<int32_t>())
    if (n != 1) return false;
  return true;
}

// Oracles 3 and 4 for a tensor as loaded (`loaded` at `coord` of `mesh`
// under `layout`, or whole with no mesh).
void check_loaded(const Tensor& loaded, const std::string& name, const json& m, const Edited& e, const Base& base,
                  const sharding::DeviceMesh* mesh, const sharding::Layout& layout, const std::vector<int>& coord) {
  const auto part = [&](const Tensor& global) {
    return mesh ? sharding::local_piece(global, layout, *mesh, coord) : global;
  };
  if (as_saved(m, name, e)) fuzz::require(same_bits(loaded, part(base.globals.at(name))));
  if (const auto ref = reference(m, name, e)) {
    fuzz::require(each_held_once(part(ref->held)));
    fuzz::require(same_bits(loaded, part(ref->value)));
  }
}

// Oracle 5: the listed tensors (those the input picks) into a target: one
// process, or each rank of a mesh in turn.
void check_target_loads(FuzzedDataProvider& p, const checkpoint::CheckpointInfo& info, const json& m, const Edited& e,
                        const Base& base, bool must_load) {
  static const std::vector<std::vector<int>> meshes = {{}, {1}, {2}, {3}, {4}, {2, 2}, {1, 3}};
  const std::vector<int>& shape_of_mesh = meshes[p.ConsumeIntegralInRange<size_t>(0, meshes.size() - 1)];
  std::optional<sharding::DeviceMesh> mesh;
  if (!shape_of_mesh.empty()) mesh.emplace(shape_of_mesh);
  struct Want {
    std::string name;
    Shape shape;
    DType dtype;
    sharding::Layout layout;
  };
  std::vector<Want> wants;
  const bool all = must_load || p.ConsumeBool();
  for (const auto& [name, t] : m.at("tensors").items()) {
    if (!all && !p.ConsumeBool()) continue;
    try {
      if (!t.at("shape").is_array()) throw Error("not a shape");
      std::vector<int64_t> dims;
      for (const auto& s : t["shape"]) {
        const auto n = exact_int(s, 0, kMaxReferenceElements);
        if (!n) throw Error("not a small shape");
        dims.push_back(*n);
      }
      Want w{name, Shape(dims), parse_dtype(t.at("dtype").get<std::string>()), {}};
      if (w.shape.numel() > kMaxReferenceElements) throw Error("too large");
      if (mesh) {
        try {
          w.layout =
              sharding::Layout::parse(make_layout(p, mesh->ndim(), static_cast<int>(dims.size()), true), mesh->ndim());
          w.layout.validate(static_cast<int>(dims.size()));
        } catch (const Error&) {
          w.layout = sharding::Layout::from_placements(
              std::vector<sharding::Placement>(static_cast<size_t>(mesh->ndim()), sharding::Placement::replicate()));
        }
      }
      wants.push_back(std::move(w));
    } catch (const json::exception&) {
      fuzz::require(!must_load);
    } catch (const Error&) {
      fuzz::require(!must_load);
    }
  }
  for (int r = 0; r < (mesh ? mesh->num_ranks() : 1); ++r) {
    const std::vector<int> coord = mesh ? mesh->coordinate(r) : std::vector<int>{};
    std::vector<checkpoint::HeldTensor> held;
    for (const Want& w : wants) {
      const Shape local = mesh ? sharding::local_chunk(w.shape, w.layout, *mesh, coord).shape : w.shape;
      Tensor t = Tensor::empty(local, w.dtype);
      if (t.nbytes() > 0) std::memset(t.raw(), 0xA5, t.nbytes());
      held.push_back({w.name, w.shape, w.layout, t});
    }
    const bool loaded = attempt("load_checkpoint", [&] {
      checkpoint::load_checkpoint(
          info, held, mesh ? checkpoint::CheckpointRank{&*mesh, coord, nullptr} : checkpoint::CheckpointRank{});
    });
    fuzz::require(loaded || !must_load);
    if (!loaded) continue;
    for (size_t i = 0; i < held.size(); ++i)
      check_loaded(held[i].local, wants[i].name, m, e, base, mesh ? &*mesh : nullptr, wants[i].layout, coord);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using sharding::DeviceMesh;
  bases = new std::vector<Base>;
  bases->push_back(make_base("one_process", std::nullopt,
                             {{"embed", {7, 5}, DType::f32, "", -1},
                              {"norm", {5}, DType::f32, "", -1},
                              {"proj", {3, 5}, DType::bf16, "", -1},
                              {"bias", {4}, DType::i64, "", -1},
                              {"empty", {0, 3}, DType::f32, "", -1},
                              {"scalar", {}, DType::f32, "", -1}},
                             3));
  bases->push_back(make_base("dp2", DeviceMesh({2}, {"dp"}),
                             {{"embed", {7, 5}, DType::f32, "S(0)", -1},
                              {"norm", {5}, DType::f32, "R", -1},
                              {"proj", {3, 5}, DType::bf16, "S(1)", -1},
                              {"bias", {4}, DType::i64, "_S(0, 2)", -1},
                              {"empty", {0, 3}, DType::f32, "S(1)", -1},
                              {"scalar", {}, DType::f32, "R", -1}},
                             1));
  bases->push_back(make_base("dp2_tp2", DeviceMesh({2, 2}, {"dp_shard", "tp"}),
                             {{"embed", {7, 5}, DType::f32, "S(0)S(1)", -1},
                              {"norm", {5}, DType::f32, "RS(0)", -1},
                              {"proj", {3, 5}, DType::bf16, "S(1)[1]S(1)[0]", -1},
                              {"bias", {9}, DType::f32, "_S(0, 2)S(0)", -1},
                              {"moment", {6, 4}, DType::f64, "S(0)[0]S(0)[1]", -1},
                              {"scalar", {}, DType::f32, "RR", -1}},
                             12));
  bases->push_back(make_base("pp2_dp2", DeviceMesh({2, 2}, {"pp", "dp"}),
                             {{"s0.w", {5, 3}, DType::f32, "RS(0)", 0},
                              {"s0.n", {3}, DType::bf16, "RR", 0},
                              {"s1.w", {4, 6}, DType::f32, "RS(1)", 1},
                              {"s1.b", {2}, DType::f32, "RR", 1}},
                             7));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  const Base& base = (*bases)[p.ConsumeIntegralInRange<size_t>(0, bases->size() - 1)];
  Edited e{base.metadata, base.metadata, {}, true, true, ""};
  for (const DiskFile& f : base.files) e.files.emplace_back(f);
  for (int n = p.ConsumeIntegralInRange(0, 8); n > 0; --n) {
    try {
      apply_edit(p, e, base);
    } catch (const json::exception&) {  // an edit of a part an earlier edit replaced
    } catch (const Error&) {            // or that the fuzzer cannot read
    }
  }
  reseal(p, e, base);
  e.folder = folder_name(p, e, base);

  const fs::path parent = fuzz::scratch_dir() / "checkpoint_metadata";
  const fs::path dir = parent / e.folder;
  fs::remove_all(parent);
  fs::create_directories(dir);
  fuzz::write_input("checkpoint_metadata/" + e.folder + "/metadata.json", e.meta.dump(1) + "\n");
  for (size_t r = 0; r < e.files.size(); ++r)
    if (e.files[r])
      fuzz::write_input("checkpoint_metadata/" + e.folder + "/" + rank_file(static_cast<int>(r)), e.files[r]->bytes);

  const json m = plain(e.meta);  // as the reader sees it
  const bool must_load = valid_edits_only(m, e);
  if (std::getenv("MESHTRAIN_FUZZ_VERBOSE")) {
    std::vector<std::string> on_disk;
    for (const auto& f : e.files)
      on_disk.push_back(!f ? "absent" : f->origin >= 0 ? fmt::format("saved {}", f->origin) : "rewritten");
    fmt::print(stderr, "{}\n{}rank files: {}\n", e.meta.dump(1), must_load ? "a valid checkpoint; " : "",
               fmt::join(on_disk, ", "));
  }
  std::optional<checkpoint::CheckpointInfo> info;
  attempt("read_checkpoint_info", [&] { info = checkpoint::read_checkpoint_info(dir.string()); });
  fuzz::require(info.has_value() || !must_load);
  if (!info) return 0;
  check_info(*info, m);
  fuzz::require(checkpoint::latest_checkpoint(parent.string()) == dir.string());

  std::optional<std::map<std::string, Tensor>> whole;
  attempt("load_checkpoint_whole", [&] { whole = checkpoint::load_checkpoint_whole(*info); });
  fuzz::require(whole.has_value() || !must_load);
  if (whole) {
    fuzz::require(whole->size() == m.at("tensors").size());
    for (const auto& [name, t] : *whole) {
      const json& described = m.at("tensors").at(name);
      fuzz::require(json(t.shape().dims()) == described.at("shape"));
      fuzz::require(t.dtype() == parse_dtype(described.at("dtype").get<std::string>()));
      check_loaded(t, name, m, e, base, nullptr, {}, {});
      if (must_load) fuzz::require(same_bits(t, base.globals.at(name)));
    }
  }
  check_target_loads(p, *info, m, e, base, must_load);
  return 0;
}
