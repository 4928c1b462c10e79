// Sharded checkpoints (checkpoint/checkpoint.h): saved on one mesh and layout,
// loaded on others (local backend threads) and on one process, each piece
// bitwise the global tensor's part (sharding::local_piece); the newest
// complete folder; damaged, truncated and missing files and a checkpoint of
// another model shape, each an error naming what is wrong.
#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "comm/local_backend.h"
#include "core/hash.h"
#include "sharding/local_chunk.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("meshtrain_ckpt_{}_{}", ::getpid(), std::random_device{}());
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  for (float& x : t.data<float>()) x = normal(gen);
  return dtype == DType::f32 ? t : t.to(dtype);
}

// The global tensors of the tests and each one's layout for a mesh.
struct Global {
  std::string name;
  Tensor value;
};
std::vector<Global> globals() {
  return {{"embed", random_tensor(Shape{7, 5}, DType::f32, 1)},
          {"norm", random_tensor(Shape{13}, DType::f32, 2)},
          {"moment", random_tensor(Shape{6, 4}, DType::bf16, 3)},
          {"scalar_like", random_tensor(Shape{1, 3}, DType::f32, 4)}};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Saves the globals on `mesh` with `layouts` (one per global), each rank its piece.
std::string save_on(const fs::path& folder, const sharding::DeviceMesh& mesh, const std::vector<std::string>& layouts,
                    int64_t step) {
  const auto g = globals();
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(20);
  comm::LocalWorld world(mesh.num_ranks(), options);
  std::string saved;
  world.run([&](comm::ProcessGroup& pg) {
    const std::vector<int> coord = mesh.coordinate(pg.rank());
    std::vector<checkpoint::HeldTensor> held;
    for (size_t i = 0; i < g.size(); ++i) {
      const auto layout = sharding::Layout::parse(layouts[i], mesh.ndim());
      held.push_back({g[i].name, g[i].value.shape(), layout, sharding::local_piece(g[i].value, layout, mesh, coord)});
    }
    const checkpoint::CheckpointState state{step, step - 1, 1234, {{"model.dim", 5}}};
    const std::string path = checkpoint::save_checkpoint(folder.string(), state, held, {&mesh, coord, &pg});
    if (pg.rank() == 0) saved = path;
  });
  return saved;
}

// Loads on `mesh` with `layouts` and checks every rank's pieces bitwise.
void expect_loads_on(const std::string& path, const sharding::DeviceMesh& mesh,
                     const std::vector<std::string>& layouts) {
  const auto g = globals();
  const checkpoint::CheckpointInfo info = checkpoint::read_checkpoint_info(path);
  comm::GroupOptions options;
  options.timeout = std::chrono::seconds(20);
  comm::LocalWorld world(mesh.num_ranks(), options);
  world.run([&](comm::ProcessGroup& pg) {
    const std::vector<int> coord = mesh.coordinate(pg.rank());
    std::vector<checkpoint::HeldTensor> held;
    for (size_t i = 0; i < g.size(); ++i) {
      const auto layout = sharding::Layout::parse(layouts[i], mesh.ndim());
      const Tensor expected = sharding::local_piece(g[i].value, layout, mesh, coord);
      held.push_back({g[i].name, g[i].value.shape(), layout, Tensor::zeros(expected.shape(), expected.dtype())});
    }
    checkpoint::load_checkpoint(info, held, {&mesh, coord, &pg});
    for (size_t i = 0; i < g.size(); ++i)
      EXPECT_TRUE(same_bits(held[i].local, sharding::local_piece(g[i].value, held[i].layout, mesh, coord)))
          << g[i].name << " on rank " << pg.rank() << " as " << layouts[i];
  });
}

}  // namespace

TEST(Checkpoint, SavedOnOneMeshLoadsOnAnyOther) {
  TempDir dir;
  // FSDP x TP-like: sharded on both dims, one dim twice (in both orders), replicated, strided.
  const sharding::DeviceMesh mesh2x2({2, 2}, {"dp_shard", "tp"});
  const std::string path = save_on(dir.path, mesh2x2, {"S(0)S(1)", "S(0)[1]S(0)[0]", "_S(0, 2)R", "RS(1)"}, 10);
  EXPECT_EQ(fs::path(path).filename(), "step_000010");
  const checkpoint::CheckpointInfo info = checkpoint::read_checkpoint_info(path);
  EXPECT_EQ(info.state.step, 10);
  EXPECT_EQ(info.state.updates_applied, 9);
  EXPECT_EQ(info.state.data_cursor, 1234);
  EXPECT_EQ(info.state.data_epoch, 0);  // the rest of the data cursor, as saved (defaults here)
  EXPECT_EQ(info.state.data_shard, "");
  EXPECT_EQ(info.state.config.at("model.dim"), 5);

  expect_loads_on(path, mesh2x2, {"S(0)S(1)", "S(0)[1]S(0)[0]", "_S(0, 2)R", "RS(1)"});           // as saved
  expect_loads_on(path, mesh2x2, {"RR", "S(0)R", "S(1)S(0)", "S(0)[0]S(0)[1]"});                  // another layout
  expect_loads_on(path, sharding::DeviceMesh({4}, {"tp"}), {"S(1)", "S(0)", "R", "S(1)"});        // another rank count
  expect_loads_on(path, sharding::DeviceMesh({3}, {"dp_shard"}), {"S(0)", "S(0)", "S(1)", "R"});  // uneven
  // One process: every tensor whole, bitwise the globals.
  const auto whole = checkpoint::load_checkpoint_whole(info);
  for (const auto& g : globals()) EXPECT_TRUE(same_bits(whole.at(g.name), g.value)) << g.name;

  // Saved on one process, loaded on a mesh.
  TempDir one;
  std::vector<checkpoint::HeldTensor> held;
  for (const auto& g : globals()) held.push_back({g.name, g.value.shape(), {}, g.value});
  const std::string single = checkpoint::save_checkpoint(one.path.string(), {3, 3, 0, {}}, held, {});
  expect_loads_on(single, mesh2x2, {"S(0)S(1)", "RR", "S(1)R", "RS(1)"});
}

TEST(Checkpoint, TheNewestCompleteOneIsFound) {
  TempDir dir;
  EXPECT_FALSE(checkpoint::latest_checkpoint(dir.path.string()).has_value());
  EXPECT_FALSE(checkpoint::latest_checkpoint((dir.path / "absent").string()).has_value());
  const sharding::DeviceMesh mesh({2});
  for (int64_t step : {5, 20, 10}) save_on(dir.path, mesh, {"S(0)", "R", "S(1)", "R"}, step);
  // A save that did not finish (no rename) and a folder without metadata are passed over.
  fs::create_directories(dir.path / "step_000030.tmp");
  fs::create_directories(dir.path / "step_000040");
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.path.string()), (dir.path / "step_000020").string());
  EXPECT_THROW(
      {
        try {
          checkpoint::read_checkpoint_info((dir.path / "step_000040").string());
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("is not complete"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  checkpoint::keep_latest_checkpoints(dir.path.string(), 2);
  EXPECT_FALSE(fs::exists(dir.path / "step_000005"));
  EXPECT_TRUE(fs::exists(dir.path / "step_000010"));
  EXPECT_TRUE(fs::exists(dir.path / "step_000020"));
}

namespace {
// The message of loading `path` whole, or "" when it loads.
std::string load_error(const std::string& path) {
  try {
    checkpoint::load_checkpoint_whole(checkpoint::read_checkpoint_info(path));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Checkpoint, DamagedFilesAreClearErrors) {
  TempDir dir;
  const sharding::DeviceMesh mesh({2});
  const std::string path = save_on(dir.path, mesh, {"S(0)", "R", "S(1)", "S(1)"}, 1);
  const fs::path shard = fs::path(path) / "rank_00001.safetensors";
  const std::string good = [&] {
    std::ifstream in(shard, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto write_shard = [&](const std::string& bytes) {
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  };
  ASSERT_EQ(load_error(path), "");

  write_shard(good.substr(0, good.size() - 3));
  EXPECT_NE(load_error(path).find("rank_00001.safetensors has " + std::to_string(good.size() - 3) + " bytes"),
            std::string::npos)
      << load_error(path);
  std::string flipped = good;
  flipped[flipped.size() - 2] ^= 0x10;
  write_shard(flipped);
  EXPECT_NE(load_error(path).find("rank_00001.safetensors is damaged: its checksum"), std::string::npos)
      << load_error(path);
  fs::remove(shard);
  EXPECT_NE(load_error(path).find("cannot read checkpoint file"), std::string::npos) << load_error(path);
  write_shard(good);
  ASSERT_EQ(load_error(path), "");

  // Metadata: not JSON; edited (its own checksum no longer matches); and,
  // edited with the checksum made to match again, a field of the wrong
  // type, an impossible step, a step other than its folder's.
  const fs::path meta = fs::path(path) / "metadata.json";
  const std::string meta_good = [&] {
    std::ifstream in(meta);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const auto resealed = [](nlohmann::ordered_json m) {
    m.erase("metadata_fnv1a64");
    m["metadata_fnv1a64"] = fmt::format("{:016x}", fnv1a(m.dump()));
    return m.dump();
  };
  std::ofstream(meta, std::ios::trunc) << meta_good.substr(0, meta_good.size() / 2);
  EXPECT_NE(load_error(path).find("metadata.json is damaged"), std::string::npos) << load_error(path);
  auto edited = nlohmann::ordered_json::parse(meta_good);
  edited["step"] = 3;
  std::ofstream(meta, std::ios::trunc) << edited.dump();
  EXPECT_NE(load_error(path).find("its contents do not match its metadata_fnv1a64"), std::string::npos)
      << load_error(path);
  std::ofstream(meta, std::ios::trunc) << resealed(edited);
  EXPECT_NE(load_error(path).find("the folder step_000001 holds step 3"), std::string::npos) << load_error(path);
  edited = nlohmann::ordered_json::parse(meta_good);
  edited["step"] = "ten";
  std::ofstream(meta, std::ios::trunc) << resealed(edited);
  EXPECT_NE(load_error(path).find("metadata.json is damaged"), std::string::npos) << load_error(path);
  edited = nlohmann::ordered_json::parse(meta_good);
  edited["updates_applied"] = 7;  // more updates than steps
  std::ofstream(meta, std::ios::trunc) << resealed(edited);
  EXPECT_NE(load_error(path).find("out of range"), std::string::npos) << load_error(path);
  std::ofstream(meta, std::ios::trunc) << meta_good;
  // A link named as a newer step is not taken for the newest checkpoint.
  const fs::path link = fs::path(path).parent_path() / "step_000009";
  fs::create_directory_symlink(fs::path(path).filename(), link);
  EXPECT_EQ(checkpoint::latest_checkpoint(fs::path(path).parent_path().string()), path);
  EXPECT_NE(load_error(link.string()).find("the folder step_000009 holds step 1"), std::string::npos);
  fs::remove(link);

  // Another model shape: the tensor and both shapes are named.
  const checkpoint::CheckpointInfo info = checkpoint::read_checkpoint_info(path);
  std::vector<checkpoint::HeldTensor> held{{"embed", Shape{8, 5}, {}, Tensor::zeros(Shape{8, 5}, DType::f32)}};
  try {
    checkpoint::load_checkpoint(info, held, {});
    ADD_FAILURE() << "a checkpoint of another shape loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'embed' has shape [7, 5], this run's is [8, 5]"), std::string::npos)
        << e.what();
  }
  held = {{"absent", Shape{2}, {}, Tensor::zeros(Shape{2}, DType::f32)}};
  EXPECT_THROW(checkpoint::load_checkpoint(info, held, {}), Error);
}

// Found by fuzz/checkpoint_metadata_fuzzer.cpp (resealed metadata, so only
// the semantic checks stand between it and the load): an integer field is
// taken exactly or refused, never truncated (step 1.5 as 1, a file of 602.5
// bytes as 602), wrapped (a mesh dim of 2^32 + 2 as 2) or converted out of
// range (1e300, undefined behaviour); and an empty tensor whose other dim is
// huge ([0, 2^40]) loads without a list of 2^40 indices.
TEST(Checkpoint, MetadataIntegersAreExactAndEmptyTensorsAllocateNothing) {
  TempDir dir;
  const std::string path = save_on(dir.path, sharding::DeviceMesh({2}), {"S(0)", "R", "S(1)", "S(1)"}, 1);
  const fs::path meta = fs::path(path) / "metadata.json";
  const auto saved = nlohmann::ordered_json::parse(std::ifstream(meta));
  const auto write_resealed = [&](nlohmann::ordered_json m) {
    m.erase("metadata_fnv1a64");
    m["metadata_fnv1a64"] = fmt::format("{:016x}", fnv1a(m.dump()));
    std::ofstream(meta, std::ios::trunc) << m.dump();
  };
  const auto expect_refused = [&](const char* key, const nlohmann::ordered_json& value, const std::string& says) {
    auto m = saved;
    m[key] = value;
    write_resealed(m);
    const std::string error = load_error(path);
    EXPECT_NE(error.find(says), std::string::npos) << key << " = " << value.dump() << ": " << error;
  };
  expect_refused("data_cursor", 1e300, "data_cursor is 1e+300, not an integer");
  expect_refused("step", 1.5, "step is 1.5, not an integer");
  expect_refused("updates_applied", nlohmann::ordered_json(~uint64_t{0}),
                 "updates_applied is 18446744073709551615, not in");
  expect_refused("version", 1.0, "version is 1.0, not an integer");
  // The data cursor's epoch and shard (datasets of shards).
  expect_refused("data_epoch", 2.5, "data_epoch is 2.5, not an integer");
  expect_refused("data_shard_index", -1, "data_epoch 0 or data_shard_index -1 is out of range");
  expect_refused("data_shard", 7, "data_shard is 7, not a string");
  {  // saved, read back; absent (a checkpoint saved before them): epoch 0, shard 0, no name
    auto cursor = saved;
    cursor["data_epoch"] = 3;
    cursor["data_shard_index"] = 2;
    cursor["data_shard"] = "train_000004.bin";
    write_resealed(cursor);
    const checkpoint::CheckpointInfo info = checkpoint::read_checkpoint_info(path);
    EXPECT_EQ(info.state.data_epoch, 3);
    EXPECT_EQ(info.state.data_shard_index, 2);
    EXPECT_EQ(info.state.data_shard, "train_000004.bin");
    for (const char* key : {"data_epoch", "data_shard_index", "data_shard"}) cursor.erase(key);
    write_resealed(cursor);
    const checkpoint::CheckpointInfo old = checkpoint::read_checkpoint_info(path);
    EXPECT_EQ(old.state.data_epoch, 0);
    EXPECT_EQ(old.state.data_shard_index, 0);
    EXPECT_EQ(old.state.data_shard, "");
  }
  auto m = saved;
  m["mesh"]["shape"][0] = (int64_t{1} << 32) + 2;
  write_resealed(m);
  EXPECT_NE(load_error(path).find("a mesh dim's size is 4294967298, not in 1..16777216"), std::string::npos)
      << load_error(path);
  m = saved;
  m["files"][1]["bytes"] = m["files"][1]["bytes"].get<double>() + 0.5;
  write_resealed(m);
  EXPECT_NE(load_error(path).find("a file's bytes is"), std::string::npos) << load_error(path);
  m = saved;
  m["tensors"]["norm"]["shape"][0] = 13.0;
  write_resealed(m);
  EXPECT_NE(load_error(path).find("a dim is 13.0, not an integer"), std::string::npos) << load_error(path);
  write_resealed(saved);
  ASSERT_EQ(load_error(path), "");

  // An empty tensor, said to be [0, 2^40]: nothing to read, nothing allocated.
  TempDir one;
  std::vector<checkpoint::HeldTensor> held{{"empty", Shape{0, 3}, {}, Tensor::zeros(Shape{0, 3}, DType::f32)},
                                           {"w", Shape{2}, {}, random_tensor(Shape{2}, DType::f32, 5)}};
  const std::string single = checkpoint::save_checkpoint(one.path.string(), {1, 1, 0, {}}, held, {});
  const fs::path single_meta = fs::path(single) / "metadata.json";
  auto e = nlohmann::ordered_json::parse(std::ifstream(single_meta));
  e["tensors"]["empty"]["shape"] = {0, int64_t{1} << 40};
  e.erase("metadata_fnv1a64");
  e["metadata_fnv1a64"] = fmt::format("{:016x}", fnv1a(e.dump()));
  std::ofstream(single_meta, std::ios::trunc) << e.dump();
  const auto whole = checkpoint::load_checkpoint_whole(checkpoint::read_checkpoint_info(single));
  EXPECT_EQ(whole.at("empty").shape(), (Shape{0, int64_t{1} << 40}));
  EXPECT_TRUE(same_bits(whole.at("w"), held[1].local));
}
