// ProcessGroup: the collectives and point-to-point operations of one group of
// ranks, asynchronous (each returns a Work). Every rank issues the same
// collectives in the same order; one thread at a time issues on a group. This front-end validates input,
// numbers every operation, records it in the flight recorder and hands a
// checked OpDesc to a backend (mpi: processes under mpirun; local: threads).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/types.h"
#include "comm/work.h"
#include "core/tensor.h"

namespace meshtrain::comm {

struct GroupOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Before each collective, ranks exchange a fingerprint (op, dtype, sizes,
  // root, per-rank counts) and fail together, with a message naming the
  // disagreement, instead of hanging or computing garbage. The mpi backend
  // sends it inside each collective's first messages, no round of its own;
  // where a group's ranks share a host those go through shared memory and
  // the check is made whatever this says (shares_memory()).
  bool verify = true;
  // Collectives advance while the caller computes: a progress thread polls
  // those nobody waits on every 50 us. Where the rank has no core to spare
  // (as many compute threads as cores) every wake-up takes the core from
  // the compute; off, collectives advance whenever one starts or is waited
  // on (and every 10 ms). The MPI backend's setting is per process: the
  // world's options decide it.
  bool background_progress = true;
};

// One operation, validated, as a backend receives it. Sizes are in elements.
struct OpDesc {
  OpType op = OpType::barrier;
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int root = -1;  // broadcast: the root (group rank)
  int peer = -1;  // send / recv: the other rank (group rank)
  int tag = 0;
  const void* in = nullptr;
  void* out = nullptr;
  int64_t in_numel = 0;
  int64_t out_numel = 0;
  std::vector<int64_t> counts;       // all_gather / reduce_scatter: elements per rank
  std::vector<int64_t> send_counts;  // all_to_all: elements this rank sends to each rank
  std::vector<int64_t> recv_counts;  // all_to_all: elements this rank receives from each rank
  // A coalesced all_gather or reduce_scatter: each member's block per rank,
  // in elements (see ProcessGroup::all_gather_coalesced); empty otherwise.
  std::vector<int64_t> members;
  uint64_t seq = 0;

  // What every rank must agree on: seq, op, dtype, reduce op, root, element
  // count, hash of per-rank counts and coalesced members, then all_to_all
  // send and recv counts (2 * group size). Backends exchange it when
  // GroupOptions::verify.
  static constexpr size_t kFingerprintHead = 7;
  std::vector<int64_t> fingerprint(int group_size) const;
  void fingerprint(int group_size, std::vector<int64_t>& f) const;  // into f, reusing its memory
  std::string signature() const;                                    // human-readable summary of the fingerprint
  // A coalesced op: where rank r's block of each member lies on the full
  // side (all_gather's output, reduce_scatter's input), in elements.
  std::vector<int64_t> member_blocks_of_rank(int group_size, int r) const;
};

// Given every rank's fingerprint (row r = rank r), the error all ranks raise,
// or an empty string when they agree. Deterministic: every rank decides alike.
std::string check_fingerprints(const std::vector<std::vector<int64_t>>& rows, const WorkInfo& info);

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  const std::string& name() const { return name_; }
  // Member i of this group is world rank world_ranks()[i].
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  virtual std::string_view backend_name() const = 0;
  // Whether the group's collectives pass their first messages, and pieces
  // of up to 20 to 68 KiB (fewer ranks, larger pieces), through memory its
  // ranks share (all on one host) rather than as messages.
  virtual bool shares_memory() const { return false; }

  // In place. bf16/f16/fp8 accumulate in f32 and round once.
  WorkPtr all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::sum);
  // output = concatenation of every rank's input in rank order. counts (one
  // per rank, in elements) for uneven inputs; empty: every input is equal.
  WorkPtr all_gather(const Tensor& input, Tensor& output, std::vector<int64_t> counts = {});
  // output = this rank's block of the reduction of every rank's input.
  // counts: elements of each rank's block; empty: equal blocks.
  WorkPtr reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::sum,
                         std::vector<int64_t> counts = {});
  // Several all_gathers (reduce_scatters) of one dtype as one collective, a
  // bucket that needs no copy in or out: `members` gives each member's block
  // per rank, in elements. The side that holds every rank's block (all_gather's
  // output, reduce_scatter's input) holds each member whole, one after
  // another, its blocks in rank order; the other side holds this rank's block
  // of every member, one after another. So the members are plain consecutive
  // tensors on both sides.
  WorkPtr all_gather_coalesced(const Tensor& input, Tensor& output, std::vector<int64_t> members);
  WorkPtr reduce_scatter_coalesced(const Tensor& input, Tensor& output, std::vector<int64_t> members,
                                   ReduceOp op = ReduceOp::sum);
  // Block j of input goes to rank j; block i of output comes from rank i.
  // Counts in elements per rank; empty: equal blocks.
  WorkPtr all_to_all(const Tensor& input, Tensor& output, std::vector<int64_t> send_counts = {},
                     std::vector<int64_t> recv_counts = {});
  WorkPtr broadcast(Tensor& tensor, int root);
  WorkPtr barrier();
  WorkPtr send(const Tensor& tensor, int dst, int tag = 0);
  WorkPtr recv(Tensor& tensor, int src, int tag = 0);

  // Collective over this group: ranks passing the same color >= 0 form a new
  // group, ordered by (key, rank). A negative color takes part but joins none
  // (returns nullptr). Names the new group "<name>" (or "<this>/<color>").
  std::shared_ptr<ProcessGroup> split(int color, int key = 0, const std::string& name = {});
  // Collective over this group: a group of the given member ranks (of this
  // group); every rank passes the same list; non-members get nullptr.
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks, const std::string& name = {});

  std::chrono::milliseconds timeout() const { return options_.timeout; }
  void set_timeout(std::chrono::milliseconds t);
  const GroupOptions& options() const { return options_; }
  // True after an operation of this group timed out: its backend state is no
  // longer usable and every further call fails.
  bool aborted() const { return aborted_.load(); }
  FlightRecorder& recorder() { return *recorder_; }
  // Write this rank's flight recorder to dir (default: FlightRecorder::default_dump_dir()).
  std::string dump_flight_recorder(const std::string& reason, const std::string& dir = {});

 protected:
  ProcessGroup(std::string name, int rank, std::vector<int> world_ranks, std::shared_ptr<FlightRecorder> recorder,
               GroupOptions options);

  // Start the operation; complete `work` with finish()/fail() (possibly later).
  virtual void start(std::shared_ptr<const OpDesc> desc, const WorkPtr& work) = 0;
  // Called on every rank of this group: build the group of `members` (ranks of
  // this group, in new-rank order) that this rank belongs to, or take part and
  // return nullptr when color < 0. `split_seq` and `color` identify the split.
  virtual std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, uint64_t split_seq, int color,
                                                      const std::string& name) = 0;
  // The backend learns that the group is aborted (after a timeout).
  virtual void on_abort() {}

  std::shared_ptr<FlightRecorder> recorder_ptr() const { return recorder_; }

 private:
  WorkPtr issue(OpDesc desc);
  // send (tensor is only read) or recv.
  WorkPtr point_to_point(OpType op, Tensor& tensor, int peer, int tag);
  std::shared_ptr<ProcessGroup> split_impl(int color, int key, const std::string& name, int64_t list_hash,
                                           const std::string& problem);
  void handle_timeout(Work& work);

  std::string name_;
  int rank_;
  std::vector<int> world_ranks_;
  std::shared_ptr<FlightRecorder> recorder_;
  GroupOptions options_;
  uint64_t next_seq_ = 1;
  uint64_t next_p2p_seq_ = 1;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  std::shared_ptr<const Work::TimeoutHandler> timeout_handler_;  // every Work's, made at the first issue
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// Every rank's text, in rank order (a collective: the lengths, then the bytes).
std::vector<std::string> all_gather_text(ProcessGroup& group, const std::string& mine);

// A stop signal (SIGTERM, SIGINT) this process received, noted by its
// handler (async-signal-safe). mpirun sends SIGTERM to every rank when one
// dies, and SIGKILL a moment later: the mpi backend names a collective that
// is still unfinished kStopReportDelay after the signal (the one the dead
// rank never joined) and dumps its flight recorder, once.
void note_stop_signal(int signal) noexcept;
int noted_stop_signal() noexcept;  // 0: none
inline constexpr std::chrono::milliseconds kStopReportDelay{400};

// Backends known to create_world.
inline constexpr std::string_view kBackendNames[] = {"mpi", "local"};

// The world group of this process for a backend that has one per process
// ("mpi": initialises MPI, rank and size from mpirun). For "local" use
// LocalWorld (one group per thread). Unknown names fail with the list.
ProcessGroupPtr create_world(std::string_view backend, GroupOptions options = {});

}  // namespace meshtrain::comm
