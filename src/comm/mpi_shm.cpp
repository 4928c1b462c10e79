// The shared-memory ring through which a one-host group of the `mpi`
// backend passes its first messages (ShmRing in mpi_op.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>

#include "comm/mpi_backend.h"
#include "comm/mpi_op.h"
#include "core/error.h"

namespace meshtrain::comm::mpi {

namespace {

// Each control word on a cache line of its own: a rank spins on the words it
// reads while its peers write theirs.
constexpr size_t kWordStride = 64;
constexpr size_t kPage = 4096;
constexpr int kNameBytes = 64;

int all_agree(MPI_Comm comm, bool mine) {
  int in = mine ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm);
  return out;
}

bool all_on_this_host(MPI_Comm comm, int size) {
  MPI_Comm local = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) != MPI_SUCCESS) return false;
  int local_size = 0;
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  return local_size == size;
}

std::byte* map_segment(int fd, size_t bytes) {
  void* at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return at == MAP_FAILED ? nullptr : static_cast<std::byte*>(at);
}

// A new zero-filled segment of `bytes`, its pages reserved now (so that a
// full /dev/shm refuses it here rather than with a SIGBUS later).
std::byte* create_segment(const char* name, size_t bytes) {
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    shm_unlink(name);
    return nullptr;
  }
  std::byte* at = map_segment(fd, bytes);
  if (at == nullptr) shm_unlink(name);
  return at;
}

std::byte* attach_segment(const char* name, size_t bytes) {
  const int fd = shm_open(name, O_RDWR, 0600);
  return fd < 0 ? nullptr : map_segment(fd, bytes);
}

}  // namespace

}  // namespace meshtrain::comm::mpi

namespace meshtrain::comm {

bool shm_allowed() {
  if (const char* v = std::getenv("MESHTRAIN_SHM"); v != nullptr && std::string_view(v) == "0") return false;
  const char* btl = std::getenv("OMPI_MCA_btl");
  if (btl == nullptr || *btl == '\0') return true;
  const bool excluding = btl[0] == '^';
  std::istringstream list(excluding ? btl + 1 : btl);
  bool names_shm = false;
  for (std::string item; std::getline(list, item, ',');) names_shm |= item == "vader" || item == "sm";
  return excluding ? !names_shm : names_shm;
}

}  // namespace meshtrain::comm

namespace meshtrain::comm::mpi {

size_t ShmRing::pairs(int size) { return kDepth * static_cast<size_t>(size) * static_cast<size_t>(size); }

// The control words, then the slots from a page boundary.
size_t ShmRing::control_bytes(int size) { return (2 * pairs(size) * kWordStride + kPage - 1) / kPage * kPage; }

size_t ShmRing::slot_bytes_for(int size) {
  const size_t fair = kSegmentBudget / pairs(size) / kPage * kPage;
  return std::clamp(fair, kMinSlot, kMaxSlot);
}

size_t ShmRing::segment_bytes(int size) { return control_bytes(size) + pairs(size) * slot_bytes_for(size); }

std::unique_ptr<ShmRing> ShmRing::open(MPI_Comm comm, int rank, int size, int max_ranks) {
  if (size < 2 || size > max_ranks) return nullptr;
  if (!all_agree(comm, shm_allowed()) || !all_agree(comm, all_on_this_host(comm, size))) return nullptr;
  static unsigned made = 0;  // segments this process named
  char name[kNameBytes] = {};
  const size_t bytes = segment_bytes(size);
  std::byte* base = nullptr;
  if (rank == 0) {
    std::snprintf(name, sizeof(name), "/meshtrain-%d-%u", static_cast<int>(getpid()), made++);
    base = create_segment(name, bytes);
  }
  int created = base != nullptr ? 1 : 0;
  MPI_Bcast(&created, 1, MPI_INT, 0, comm);
  if (created == 0) return nullptr;
  MPI_Bcast(name, kNameBytes, MPI_CHAR, 0, comm);
  if (rank != 0) base = attach_segment(name, bytes);
  const bool everyone = all_agree(comm, base != nullptr) != 0;  // every rank has attached, or given up
  if (rank == 0) shm_unlink(name);  // the mappings keep it; nothing is left behind when the job ends
  if (!everyone) {
    if (base != nullptr) munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<ShmRing>(new ShmRing(base, bytes, size));
}

ShmRing::~ShmRing() { munmap(base_, bytes_); }

size_t ShmRing::pair(uint64_t seq, int from, int to) const {
  const auto n = static_cast<size_t>(size_);
  return ((seq % kDepth) * n + static_cast<size_t>(from)) * n + static_cast<size_t>(to);
}

// Table 0: the sequence number of the message in a slot (its sender's);
// table 1: that of the last message read from it (its receiver's).
std::atomic_ref<uint64_t> ShmRing::word(size_t table, size_t pair) const {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base_ + (table * pairs(size_) + pair) * kWordStride));
}

bool ShmRing::writable(uint64_t seq, int from, int to) const {
  return word(1, pair(seq, from, to)).load(std::memory_order_acquire) + kDepth >= seq;
}

std::byte* ShmRing::slot(uint64_t seq, int from, int to) const {
  return base_ + control_bytes(size_) + pair(seq, from, to) * slot_bytes_;
}

void ShmRing::publish(uint64_t seq, int from, int to) {
  word(0, pair(seq, from, to)).store(seq, std::memory_order_release);
}

bool ShmRing::arrived(uint64_t seq, int from, int to) const {
  return word(0, pair(seq, from, to)).load(std::memory_order_acquire) == seq;
}

void ShmRing::consume(uint64_t seq, int from, int to) {
  word(1, pair(seq, from, to)).store(seq, std::memory_order_release);
}

}  // namespace meshtrain::comm::mpi
