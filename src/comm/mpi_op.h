// Internal to the `mpi` backend (mpi_backend.cpp runs operations,
// mpi_plans.cpp cuts each into stages, mpi_first_stage.cpp checks the
// fingerprints on the way, mpi_shm.cpp passes first messages through shared
// memory): the MPI state of a group, of one operation in
// flight, and of its stages. Includes <mpi.h>, which nothing outside
// comm/mpi_*.cpp includes.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"

namespace meshtrain::comm::mpi {

std::string error_text(int code);
// n bytes as an MPI count; a CommError naming `what` beyond MPI's 2 GiB.
int to_int_count(int64_t n, const char* what);

// Bytes that MPI or a memcpy fills: growing it does not zero them.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }
  // At least `bytes` (the contents are lost when it grows).
  std::byte* reserve(size_t bytes) {
    if (bytes > size_) {
      data_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
      size_ = bytes;
    }
    return data_.get();
  }
  std::byte* data() const { return data_.get(); }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

struct MpiOp;

// Shared memory through which the ranks of a group that all run on one host
// pass their first messages (FirstStage) instead of through MPI: a slot per
// ordered pair of ranks for each of the last kDepth collectives, written by
// the sender, published with a release store of the op's sequence number,
// read and given back by the receiver. A collective whose pieces fit the
// first messages then moves no MPI message at all, and a larger one sends
// only its second messages through MPI.
class ShmRing {
 public:
  // First messages in flight per pair: a rank whose peer has not yet read
  // the first message of collective seq - kDepth defers that of seq.
  static constexpr uint64_t kDepth = 8;

  // Collective over `comm` (blocking, every rank returns alike): the group's
  // ring where its `size` ranks all run on this host, at most
  // max_ranks of them, and shared memory is allowed (comm::shm_allowed); nullptr
  // otherwise, or where the segment could not be made on some rank.
  static std::unique_ptr<ShmRing> open(MPI_Comm comm, int rank, int size, int max_ranks);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Bytes of a slot: a first message's header (the fingerprint) and its
  // piece, where the piece fits. kSegmentBudget / (kDepth x ranks^2),
  // between 20 and 68 KiB: 68 KiB up to 4 ranks (the 64 KiB pieces of a
  // 256 KiB all_to_all), 20 KiB for 7 and 8.
  size_t slot_bytes() const { return slot_bytes_; }
  // Whether the first message of collective `seq` from `from` to `to` may be
  // written: its receiver has read the one it replaces.
  bool writable(uint64_t seq, int from, int to) const;
  std::byte* slot(uint64_t seq, int from, int to) const;
  void publish(uint64_t seq, int from, int to);
  // Whether the message of collective `seq` from `from` to `to` is there to
  // read (at slot(seq, from, to)); give its slot back with consume().
  bool arrived(uint64_t seq, int from, int to) const;
  void consume(uint64_t seq, int from, int to);

 private:
  static constexpr size_t kSegmentBudget = 9 << 20, kMinSlot = 20 << 10, kMaxSlot = 68 << 10;
  ShmRing(std::byte* base, size_t bytes, int size)
      : base_(base), bytes_(bytes), size_(size), slot_bytes_(slot_bytes_for(size)) {}
  static size_t pairs(int size);
  static size_t slot_bytes_for(int size);
  static size_t control_bytes(int size);
  static size_t segment_bytes(int size);
  size_t pair(uint64_t seq, int from, int to) const;
  std::atomic_ref<uint64_t> word(size_t table, size_t pair) const;

  std::byte* base_;
  size_t bytes_;
  int size_;
  size_t slot_bytes_;
};

// MPI state of one group, shared by its ProcessGroup object and its in-flight ops.
struct GroupComm {
  MPI_Comm comm = MPI_COMM_NULL;            // MPI collectives and the caller's send / recv
  MPI_Comm first_exchange = MPI_COMM_NULL;  // first stages' messages, matched in issue order
  MPI_Comm exchange = MPI_COMM_NULL;        // other pairwise messages, tagged by sequence number
  int rank = 0;
  int size = 0;
  int tag_ub = 32767;  // MPI's largest tag (the standard promises at least 32767)
  bool verify = true;
  bool aborted = false;
  // Ops whose ordered stages are still to be posted on `comm`. Only the head
  // posts, so that every rank posts them in issue order whatever the timing.
  std::deque<MpiOp*> post_queue;
  // Buffers of first stages that completed, for the next ones to take
  // (FirstStage) instead of allocating their own.
  std::vector<Buffer> spare_buffers;
  // Where the group's first messages go through shared memory: the ring,
  // and the sequence number of the next collective to post its first stage
  // there (first stages post in issue order, see FirstStage::may_post).
  std::unique_ptr<ShmRing> shm;
  uint64_t next_shm_seq = 1;

  // The tag of an op's messages on `exchange`.
  int exchange_tag(uint64_t seq) const { return static_cast<int>(seq % (static_cast<uint64_t>(tag_ub) + 1)); }
};

// What a pairwise stage sends to or receives from one rank: `count` items of
// `type` at `at` (MPI_BYTE, or a committed datatype the op owns).
struct Piece {
  void* at = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
};

// A pairwise stage's pieces, indexed by group rank; this rank's own pair is
// copied locally.
struct Pieces {
  std::vector<Piece> send, recv;
};

// One step of an operation: it posts MPI requests, and once they complete a
// host step runs.
struct Stage {
  // An ordered stage posts MPI collectives on the group's `comm` (returns an
  // MPI error code): every rank must post them in the same order, so an op
  // posts them only from the head of its group's post queue.
  std::function<int(MpiOp&, std::vector<MPI_Request>&)> post;
  // A pairwise stage (no `post`) sends one message to, and receives one from,
  // every other rank of the group (empty ones too), on `exchange`: it needs
  // no order, so it posts at once.
  std::function<void(MpiOp&, Pieces&)> pieces;
  std::function<void(MpiOp&)> after;  // host step, may be empty
  bool pairwise() const { return !post; }
};

// The first stage of a collective on a group that verifies: a pairwise stage
// whose messages carry the fingerprints, so that checking them costs no
// round of messages of its own. Each rank sends every other rank exactly one
// message on `first_exchange` (or through the group's ShmRing), whatever
// the op: its fingerprint, then as
// much of the piece for that rank as fits (kFirstMessageBytes in all, see
// inline_bytes); the rest follows at once as a second message on `exchange`,
// straight from and into place. A rank posts its receives with its own sizes before the ranks are
// known to agree; where they do not, the first messages still all match
// (each fits its receive), and each rank learns from its peers' headers of
// any second message it did not expect (it receives and drops it) or that
// will not come (it cancels its receive), so no rank hangs and nothing stays
// queued. Once every message is in, each rank holds every rank's
// fingerprint, and all decide alike.
class FirstStage {
 public:
  // Begin the first stage of `op` (ahead of post), reusing this object's
  // memory from an earlier op.
  void start(const MpiOp& op);
  // Post the messages of the first stage with pieces `p` (or, where laying
  // them out failed with `local_error`, empty ones). Returns an MPI error code.
  int post(MpiOp& op, const Pieces& p, std::string local_error);
  // Note the `completed` requests of the op (MPI_Testsome's indices and
  // statuses, rc its return code): reads the headers that came in.
  void note(MpiOp& op, const int* indices, const MPI_Status* statuses, int completed, int rc);
  // Once every request has completed and every first message is in: the
  // error every rank raises (and whether it leaves the group unusable), or
  // "" when the ranks agree; then the inline data is in place. Gives the
  // stage's buffer back to the group.
  std::string finish(MpiOp& op, bool& breaks_group);

  // Whether the first stage of `op` may post now: through MPI at once;
  // through the group's shared memory in issue order, once each peer has
  // read what the op's slots last held (ShmRing::writable).
  static bool may_post(const MpiOp& op);
  // Through shared memory: read the first messages that came in (their
  // headers may post receives, as note's do). Returns whether any did.
  bool poll_shm(MpiOp& op);
  // First messages through shared memory not yet in.
  int unheard() const { return unheard_; }
  bool via_shm() const { return shm_ != nullptr; }

  // A first message carries the fingerprint and as much of the piece as fits
  // in this many bytes, in groups of at most kMaxInlineRanks (each rank holds a
  // slot of it per peer): a second message costs more than copying that
  // much, and Open MPI's shared-memory transport sends only messages within
  // 4 KiB, its own header included, without waiting for the receiver.
  // Through shared memory a piece goes whole inside its first message where
  // it fits the slot (ShmRing::slot_bytes), else whole in a second one:
  // copying it through the ring costs less than an MPI message.
  static constexpr int kFirstMessageBytes = 4000;
  static constexpr int kMaxInlineRanks = 8;

 private:
  struct Peer {
    int rank = 0;
    Piece recv;              // where this rank's piece from the peer goes
    int inline_bytes = 0;    // of it, in the first message
    int rest_request = -1;   // the second message's receive (index into the op's requests), or -1
    bool rest_sent = false;  // the peer sends a second message
    bool heard = false;      // its first message came in through shared memory
  };
  int header_bytes() const { return static_cast<int>((fingerprint_.size() + 1) * sizeof(int64_t)); }
  int inline_bytes(const MpiOp& op, int bytes) const;
  int post_receives(MpiOp& op, Peer& peer, size_t k);
  int post_sends(MpiOp& op, int peer, const Piece& send, size_t k);
  void read_header(MpiOp& op, Peer& peer, int slot);
  std::string verdict(MpiOp& op, bool& breaks_group) const;
  bool agree(const MpiOp& op) const;
  std::string disagreement(const MpiOp& op) const;
  const int64_t* row(int slot) const;
  const int64_t* row_of_rank(const MpiOp& op, int rank) const;
  const std::byte* inline_data(const MpiOp& op, size_t k) const;

  std::vector<int64_t> fingerprint_;  // this rank's, and last a word: nonzero where it could not lay out its part
  std::string local_error_;
  std::vector<Peer> peers_;                      // every other rank, in rank order
  size_t slot_bytes_ = 0;                        // of one first message: header, then inline data
  Buffer slots_;                                 // the first messages: a slot per peer in, then (MPI) one per peer out
  ShmRing* shm_ = nullptr;                       // the group's, where first messages go through it
  int first_requests_ = 0;                       // the op's requests that carry first messages (MPI: 2 per peer)
  int unheard_ = 0;                              // peers whose first message has not come through shm_
  std::vector<std::vector<std::byte>> dropped_;  // second messages this rank did not expect
  mutable std::vector<const int64_t*> by_rank_;  // agree's: each rank's fingerprint
  int error_ = MPI_SUCCESS;
};

// One operation: its stages, run one after another.
struct MpiOp {
  std::shared_ptr<const OpDesc> desc;
  WorkPtr work;
  std::shared_ptr<GroupComm> group;
  std::vector<Stage> stages;
  size_t next_stage = 0;              // the next to post
  bool in_flight = false;             // stage next_stage - 1 is posted and not yet complete
  std::vector<MPI_Request> requests;  // of the stage in flight
  int pending = 0;                    // of those, not yet complete
  FirstStage* first = nullptr;        // with GroupOptions::verify, until the first stage completes: first_stage
  FirstStage first_stage;
  Buffer scratch;
  // Committed for the requests of the stage in flight; freed with the op or
  // when a later stage starts.
  std::vector<MPI_Datatype> datatypes;
  MPI_Status status{};  // of the last p2p request
  bool in_post_queue = false;
  bool done = false;

  MpiOp() = default;
  MpiOp(const MpiOp&) = delete;
  MpiOp& operator=(const MpiOp&) = delete;
  ~MpiOp() { free_datatypes(); }
  void free_datatypes();
  // Forget a done op, keeping the memory its vectors hold for the next.
  void recycle();
  // Whether a stage after the one in flight posts on `comm` (keeps the op in
  // its group's post queue).
  bool ordered_stage_ahead() const;
  // Whether an MPI request of the op is still posted (a failed op's).
  bool requests_outstanding() const;
};

// Groups of at most this many ranks run all_gather and all_reduce (below
// 128 KiB, or of a dtype MPI cannot reduce) as pairwise stages, every rank
// sending to every other (Open MPI's non-blocking calls take more rounds of
// messages at small sizes, see mpi_plans.cpp); larger ones use MPI's
// collectives, which take log(n) rounds of messages instead of n - 1
// messages per rank. all_to_all and reduce_scatter are pairwise in groups of
// any size (as MPI's own all-to-all is).
inline constexpr int kMaxPairwiseRanks = 8;

// Append the stages of an operation on a group of n ranks of which this is
// `rank`.
void plan_stages(const OpDesc& d, int n, int rank, std::vector<Stage>& stages);

}  // namespace meshtrain::comm::mpi
