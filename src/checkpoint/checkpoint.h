// Sharded training checkpoints. A checkpoint is a folder per step: each
// rank's pieces of the tensors (parameters, AdamW moments) in its own
// safetensors file, and metadata.json (written by rank 0) with the step, the
// data cursor, the model, the mesh and every tensor's global shape and
// layout, and each file's size and checksum. The folder is written as
// step_N.tmp and renamed to step_N only once every rank's file is on disk:
// a folder without that name is never loaded. Loading recomputes which
// global indices each saved piece holds from its layout, so a checkpoint
// saved on any mesh loads on any other (or on one process).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "sharding/device_mesh.h"
#include "sharding/layout.h"

namespace meshtrain::checkpoint {

// Where this process stands: one process (no mesh), or a rank of a mesh.
struct CheckpointRank {
  const sharding::DeviceMesh* mesh = nullptr;  // null: one process, every tensor whole
  std::vector<int> coordinate;                 // this rank's, on mesh
  comm::ProcessGroup* world = nullptr;         // the mesh's ranks (null with no mesh)
};

// A tensor as this rank holds it: its piece of a global tensor under a layout.
struct HeldTensor {
  std::string name;
  Shape global_shape;
  sharding::Layout layout;  // on the CheckpointRank's mesh (ignored with none)
  Tensor local;             // this rank's piece; filled in place by load_checkpoint
  // Pipeline parallel: only the ranks at this coordinate of the mesh's first
  // dim (pp) hold the tensor (its layout is Replicate there); -1: every rank.
  int pipeline_rank = -1;
};

// What a checkpoint holds beside its tensors.
struct CheckpointState {
  int64_t step = 0;             // steps done
  int64_t updates_applied = 0;  // the optimizer's updates (steps less those skipped)
  int64_t data_cursor = 0;      // the data's position: the token offset in the shard data_shard (below)
  nlohmann::json config;        // the model and optimizer keys a resumed run must match
  // The line of steps this one is on (16 hex digits): a resume from the
  // newest step goes on with it, a rollback (an older step resumed) starts a
  // new one. "" in a checkpoint that does not say.
  std::string trajectory;
  // For the record (a resumed run does not need it): the LR schedule's keys
  // and the LR of this step (a function of the step), the seed (nothing
  // random is drawn after initialisation), the data file and batch shape.
  nlohmann::json run = nlohmann::json::object();
  // The rest of the data's position (train::DataCursor; global, whatever
  // the layout): the epoch, the shard's place in the epoch's order and its
  // name (0, 0 and "" in a checkpoint saved before datasets of shards).
  int64_t data_epoch = 0, data_shard_index = 0;
  std::string data_shard;
};

// A save in three parts, so that the writing can run beside training:
// begin_checkpoint (a collective: the step_N.tmp folder made, the tensors to
// write listed), write_checkpoint_file (this rank's file; no collective, so
// it may run on a thread of its own, on tensors nobody changes meanwhile),
// complete_checkpoint (a collective: every rank's outcome agreed; rank 0
// writes the metadata and renames the folder). save_checkpoint does all three.
struct PendingCheckpoint {
  struct Described {
    std::string name;
    Shape global_shape;
    DType dtype;
    std::string layout;  // "" with no mesh
    int pipeline_rank = -1;
  };
  std::string folder, final_path, partial;
  CheckpointState state;
  CheckpointRank where;
  std::vector<Described> described;      // every tensor, for the metadata
  std::map<std::string, Tensor> pieces;  // what this rank writes (emptied once written)
  int64_t file_bytes = 0;
  uint64_t checksum = 0;
  std::string failure;  // of this rank's write
};
PendingCheckpoint begin_checkpoint(const std::string& folder, const CheckpointState& state,
                                   const std::vector<HeldTensor>& tensors, const CheckpointRank& where);
void write_checkpoint_file(PendingCheckpoint& save);
std::string complete_checkpoint(PendingCheckpoint& save);  // returns the checkpoint's path

// A fresh trajectory id: 16 random hex digits.
std::string new_trajectory_id();

// "step_000010": the folder of a step's checkpoint.
std::string checkpoint_folder_name(int64_t step);

// Writes the checkpoint of state.step under `folder` (made if missing) and
// returns its path. A collective on several ranks: every rank writes its
// pieces (of a replicated tensor, only the ranks at coordinate 0 on the mesh
// dims it is replicated on); rank 0 writes the metadata and renames the
// folder once all have. A rank that fails makes every rank throw; nothing
// under the final name is left.
std::string save_checkpoint(const std::string& folder, const CheckpointState& state,
                            const std::vector<HeldTensor>& tensors, const CheckpointRank& where);

// The newest complete checkpoint (step_N with its metadata) in `folder`, or
// none (no folder, or nothing complete in it).
std::optional<std::string> latest_checkpoint(const std::string& folder);
// Every step_N folder in `folder`, complete or not (none when it is missing).
std::vector<std::string> checkpoint_step_folders(const std::string& folder);

// A rollback: every complete checkpoint in `folder` after `step` moved into
// `folder`/`aside` (made), where nothing resumes or deletes it. Returns the
// steps moved, in order.
std::vector<int64_t> set_aside_steps_after(const std::string& folder, int64_t step, const std::string& aside);

// A checkpoint's metadata, checked: what it holds and how it was laid out.
struct CheckpointInfo {
  std::string path;
  CheckpointState state;
  nlohmann::json metadata;
};
CheckpointInfo read_checkpoint_info(const std::string& path);

// Fills every tensor's `local` (its shape and dtype as this rank holds it)
// from the checkpoint, whatever mesh and layout it was saved with. Throws
// naming the file and what is wrong: a tensor the checkpoint lacks or holds
// with another global shape or dtype, a missing or damaged file (size and
// checksum are verified for every file read).
void load_checkpoint(const CheckpointInfo& checkpoint, std::vector<HeldTensor>& tensors, const CheckpointRank& where);

// Every tensor of the checkpoint whole (for export), on this process alone.
std::map<std::string, Tensor> load_checkpoint_whole(const CheckpointInfo& checkpoint);

// Every rank learns whether any rank's `failure` is set; the lowest such
// rank throws it (and takes the job down), the others wait for that, so the
// error is said once. With no world, throws `failure` if set.
void fail_together(const std::string& failure, comm::ProcessGroup* world);

// Deletes all but the newest `keep` complete checkpoints in `folder`
// (keep <= 0: none deleted; a link to a step is not one).
void keep_latest_checkpoints(const std::string& folder, int keep);

}  // namespace meshtrain::checkpoint
