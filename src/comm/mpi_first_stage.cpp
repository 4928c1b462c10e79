// The fingerprint check of the `mpi` backend, carried by an op's first stage
// (FirstStage in mpi_op.h).
#include <algorithm>
#include <cstring>

#include "comm/mpi_op.h"
#include "core/copy.h"
#include "core/error.h"

namespace meshtrain::comm::mpi {

namespace {

constexpr size_t kWord = sizeof(int64_t);

int byte_size(const Piece& piece) {
  int size = 1;
  if (piece.type != MPI_BYTE) MPI_Type_size(piece.type, &size);
  return piece.count * size;
}

}  // namespace

void FirstStage::start(const MpiOp& op) {
  op.desc->fingerprint(op.group->size, fingerprint_);
  fingerprint_.push_back(0);  // this rank laid out its part
  local_error_.clear();
  dropped_.clear();
  error_ = MPI_SUCCESS;
  shm_ = nullptr;
  first_requests_ = unheard_ = 0;
}

// A first message: this rank's fingerprint, then the bytes of the second
// message to that peer (0: none), then the inline data.
const int64_t* FirstStage::row(int slot) const {
  return reinterpret_cast<const int64_t*>(slots_.data() + static_cast<size_t>(slot) * slot_bytes_);
}

// How much of a piece of `bytes` goes inside the first message: through
// shared memory all of it where it fits the slot, else none; through MPI
// what fits, where the rest fits a second message of that size too (two
// short messages go without waiting for the receiver, as one long one does
// not), else none (a second message moves the piece without copies). The
// same on both sides of a pair wherever the ranks agree. A coalesced op's
// pieces are datatypes, sent apart.
int FirstStage::inline_bytes(const MpiOp& op, int bytes) const {
  if (op.group->size > kMaxInlineRanks || !op.desc->members.empty()) return 0;
  if (op.group->shm)
    return static_cast<size_t>(bytes) + static_cast<size_t>(header_bytes()) <= op.group->shm->slot_bytes() ? bytes : 0;
  const int room = kFirstMessageBytes - header_bytes();
  return bytes > room + kFirstMessageBytes ? 0 : std::min(bytes, room);
}

bool FirstStage::may_post(const MpiOp& op) {
  const GroupComm& g = *op.group;
  if (!g.shm) return true;
  const uint64_t seq = op.desc->seq;
  if (seq != g.next_shm_seq) return false;
  for (int r = 0; r < g.size; ++r)
    if (r != g.rank && !g.shm->writable(seq, g.rank, r)) return false;
  return true;
}

int FirstStage::post(MpiOp& op, const Pieces& p, std::string local_error) {
  GroupComm& g = *op.group;
  local_error_ = std::move(local_error);
  if (!local_error_.empty()) fingerprint_.back() = 1;
  const auto header = static_cast<size_t>(header_bytes());
  shm_ = g.shm.get();
  slot_bytes_ = std::max<size_t>(header, g.size <= kMaxInlineRanks ? kFirstMessageBytes : 0);
  if (shm_ != nullptr) {
    // This rank's copy holds the headers only; the messages stay in the ring.
    slot_bytes_ = header;
    MT_ASSERT(header <= shm_->slot_bytes(), "a first message's header of {} bytes exceeds a slot", header);
    g.next_shm_seq = op.desc->seq + 1;
  }
  peers_.clear();
  peers_.reserve(static_cast<size_t>(g.size - 1));
  for (int r = 0; r < g.size; ++r)
    if (r != g.rank) peers_.push_back(Peer{r, p.recv[r]});
  if (!op.group->spare_buffers.empty()) {
    slots_ = std::move(op.group->spare_buffers.back());
    op.group->spare_buffers.pop_back();
  }
  slots_.reserve((shm_ ? 1 : 2) * slot_bytes_ * peers_.size());
  first_requests_ = shm_ ? 0 : static_cast<int>(2 * peers_.size());
  unheard_ = shm_ ? static_cast<int>(peers_.size()) : 0;
  op.requests.reserve(4 * peers_.size());  // and a second message each way with each
  op.requests.assign(static_cast<size_t>(first_requests_), MPI_REQUEST_NULL);
  op.pending = 0;
  // Every receive first, so that no message arrives before its receive.
  int rc = MPI_SUCCESS;
  for (size_t k = 0; k < peers_.size() && rc == MPI_SUCCESS; ++k) rc = post_receives(op, peers_[k], k);
  for (size_t k = 0; k < peers_.size() && rc == MPI_SUCCESS; ++k)
    rc = post_sends(op, peers_[k].rank, p.send[peers_[k].rank], k);
  return rc;
}

// The receives from the peer of slot k: its first message (request 2 k),
// and its second where the piece is longer than its inline part.
int FirstStage::post_receives(MpiOp& op, Peer& peer, size_t k) {
  const GroupComm& g = *op.group;
  const int bytes = byte_size(peer.recv);
  peer.inline_bytes = inline_bytes(op, bytes);
  int rc = MPI_SUCCESS;
  if (shm_ == nullptr) {
    rc = MPI_Irecv(slots_.data() + k * slot_bytes_, static_cast<int>(slot_bytes_), MPI_BYTE, peer.rank, 0,
                   g.first_exchange, &op.requests[2 * k]);
    if (rc != MPI_SUCCESS) return rc;
    ++op.pending;
  }
  if (bytes == peer.inline_bytes) return rc;
  peer.rest_request = static_cast<int>(op.requests.size());
  op.requests.push_back(MPI_REQUEST_NULL);
  const int tag = g.exchange_tag(op.desc->seq);
  auto* at = static_cast<std::byte*>(peer.recv.at) + peer.inline_bytes;
  rc = peer.inline_bytes > 0
           ? MPI_Irecv(at, bytes - peer.inline_bytes, MPI_BYTE, peer.rank, tag, g.exchange, &op.requests.back())
           : MPI_Irecv(peer.recv.at, peer.recv.count, peer.recv.type, peer.rank, tag, g.exchange, &op.requests.back());
  if (rc == MPI_SUCCESS) ++op.pending;
  return rc;
}

// The sends to the peer of slot k: the first message (request 2 k + 1) of
// this rank's fingerprint, the bytes of the second and the inline part of
// the piece, and the second where the piece is longer.
int FirstStage::post_sends(MpiOp& op, int peer, const Piece& send, size_t k) {
  const GroupComm& g = *op.group;
  const auto header = static_cast<size_t>(header_bytes());
  const int bytes = byte_size(send), inline_part = inline_bytes(op, bytes);
  const uint64_t seq = op.desc->seq;
  std::byte* out = shm_ ? shm_->slot(seq, g.rank, peer) : slots_.data() + (peers_.size() + k) * slot_bytes_;
  std::memcpy(out, fingerprint_.data(), fingerprint_.size() * kWord);
  const int64_t rest = bytes - inline_part;
  std::memcpy(out + fingerprint_.size() * kWord, &rest, kWord);
  if (inline_part > 0) copy_bytes(out + header, send.at, static_cast<size_t>(inline_part));
  int rc = MPI_SUCCESS;
  if (shm_ != nullptr) {
    shm_->publish(seq, g.rank, peer);
  } else {
    rc = MPI_Isend(out, static_cast<int>(header) + inline_part, MPI_BYTE, peer, 0, g.first_exchange,
                   &op.requests[2 * k + 1]);
    if (rc != MPI_SUCCESS) return rc;
    ++op.pending;
  }
  if (rest == 0) return rc;
  op.requests.push_back(MPI_REQUEST_NULL);
  const int tag = g.exchange_tag(op.desc->seq);
  auto* at = static_cast<std::byte*>(send.at) + inline_part;
  rc = inline_part > 0 ? MPI_Isend(at, static_cast<int>(rest), MPI_BYTE, peer, tag, g.exchange, &op.requests.back())
                       : MPI_Isend(send.at, send.count, send.type, peer, tag, g.exchange, &op.requests.back());
  if (rc == MPI_SUCCESS) ++op.pending;
  return rc;
}

void FirstStage::note(MpiOp& op, const int* indices, const MPI_Status* statuses, int completed, int rc) {
  for (int i = 0; i < completed; ++i) {
    const int index = indices[i];
    if (rc == MPI_ERR_IN_STATUS && statuses[i].MPI_ERROR != MPI_SUCCESS) {
      // A second message longer than its receive (the ranks disagree), or a
      // failure; MPI keeps a request that completed in error until freed.
      if (op.requests[index] != MPI_REQUEST_NULL) MPI_Request_free(&op.requests[index]);
      if (error_ == MPI_SUCCESS) error_ = statuses[i].MPI_ERROR;
    } else if (index < first_requests_ && index % 2 == 0) {
      read_header(op, peers_[index / 2], index / 2);
    }
  }
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS && error_ == MPI_SUCCESS) error_ = rc;
}

bool FirstStage::poll_shm(MpiOp& op) {
  const GroupComm& g = *op.group;
  const uint64_t seq = op.desc->seq;
  bool any = false;
  for (size_t k = 0; k < peers_.size() && unheard_ > 0; ++k) {
    Peer& peer = peers_[k];
    if (peer.heard || !shm_->arrived(seq, peer.rank, g.rank)) continue;
    // Its header; the inline data stays in the slot until finish copies it
    // into place (and gives the slot back).
    std::memcpy(slots_.data() + k * slot_bytes_, shm_->slot(seq, peer.rank, g.rank),
                static_cast<size_t>(header_bytes()));
    peer.heard = true;
    --unheard_;
    any = true;
    read_header(op, peer, static_cast<int>(k));
  }
  return any;
}

// A peer's first message came in. Where it and this rank disagree on a
// second message (the ranks disagree on the op), this rank cancels the
// receive it posted, or receives the message it did not expect into a
// buffer it drops, so that every message is matched.
void FirstStage::read_header(MpiOp& op, Peer& peer, int slot) {
  const int64_t* header = row(slot);
  const int64_t rest = header[fingerprint_.size()];
  const auto seq = static_cast<uint64_t>(header[0]);
  const bool expected = peer.rest_request >= 0, matches = rest > 0 && expected && seq == op.desc->seq;
  if (expected && !matches) MPI_Cancel(&op.requests[peer.rest_request]);
  if (rest <= 0 || matches) return;
  const GroupComm& g = *op.group;
  dropped_.emplace_back(static_cast<size_t>(rest));
  op.requests.push_back(MPI_REQUEST_NULL);
  if (MPI_Irecv(dropped_.back().data(), static_cast<int>(rest), MPI_BYTE, peer.rank, g.exchange_tag(seq), g.exchange,
                &op.requests.back()) == MPI_SUCCESS)
    ++op.pending;
  else if (error_ == MPI_SUCCESS)
    error_ = MPI_ERR_OTHER;
}

std::string FirstStage::finish(MpiOp& op, bool& breaks_group) {
  std::string problem = verdict(op, breaks_group);
  if (shm_ != nullptr)
    for (const Peer& peer : peers_) shm_->consume(op.desc->seq, peer.rank, op.group->rank);
  op.group->spare_buffers.push_back(std::move(slots_));
  return problem;
}

// Where the inline data from the peer of slot k is: in its shared-memory
// slot, or in this rank's copy of its first message.
const std::byte* FirstStage::inline_data(const MpiOp& op, size_t k) const {
  const std::byte* message = shm_ ? shm_->slot(op.desc->seq, peers_[k].rank, op.group->rank)
                                  : reinterpret_cast<const std::byte*>(row(static_cast<int>(k)));
  return message + header_bytes();
}

std::string FirstStage::verdict(MpiOp& op, bool& breaks_group) const {
  breaks_group = false;
  if (!agree(op)) return disagreement(op);
  if (error_ != MPI_SUCCESS) {
    breaks_group = true;
    return fmt::format("{} failed in MPI: {}", op.work->info().describe(), error_text(error_));
  }
  for (size_t k = 0; k < peers_.size(); ++k)
    if (peers_[k].inline_bytes > 0)
      copy_bytes(peers_[k].recv.at, inline_data(op, k), static_cast<size_t>(peers_[k].inline_bytes));
  return "";
}

const int64_t* FirstStage::row_of_rank(const MpiOp& op, int rank) const {
  if (rank == op.group->rank) return fingerprint_.data();
  return row(rank < op.group->rank ? rank : rank - 1);
}

// Whether every rank laid out its part and the fingerprints agree as
// check_fingerprints asks (the same head; all_to_all: what each rank sends
// another is what that one expects from it), without building its table.
bool FirstStage::agree(const MpiOp& op) const {
  const int n = op.group->size;
  const size_t width = fingerprint_.size(), head = OpDesc::kFingerprintHead;
  by_rank_.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) by_rank_[r] = row_of_rank(op, r);
  for (const int64_t* f : by_rank_)
    if (f[width - 1] != 0 || !std::equal(f, f + head, fingerprint_.data())) return false;
  if (op.desc->op != OpType::all_to_all) return true;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (by_rank_[i][head + j] != by_rank_[j][head + n + i]) return false;
  return true;
}

// What the ranks' fingerprints say is wrong ("" when they agree and every
// rank laid out its part). Every rank holds the same table, so every rank
// decides alike.
std::string FirstStage::disagreement(const MpiOp& op) const {
  const int n = op.group->size;
  const size_t width = fingerprint_.size();
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(n));
  rows[op.group->rank].assign(fingerprint_.begin(), fingerprint_.end() - 1);
  bool laid_out = fingerprint_.back() == 0;
  int failed_rank = laid_out ? -1 : op.group->rank;
  for (size_t k = 0; k < peers_.size(); ++k) {
    const int64_t* r = row(static_cast<int>(k));
    rows[peers_[k].rank].assign(r, r + width - 1);
    if (r[width - 1] != 0 && (failed_rank < 0 || peers_[k].rank < failed_rank)) failed_rank = peers_[k].rank;
  }
  std::string problem = check_fingerprints(rows, op.work->info());
  if (!problem.empty() || failed_rank < 0) return problem;
  if (failed_rank == op.group->rank) return local_error_;
  return fmt::format("{} failed on rank {}, which could not lay out its part of it", op.work->info().describe(),
                     failed_rank);
}

}  // namespace meshtrain::comm::mpi
