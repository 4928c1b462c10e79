#include "comm/local_backend.h"

#include <fmt/ranges.h>

#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

#include "comm/reduce.h"
#include "core/copy.h"
#include "core/error.h"

namespace meshtrain::comm {

namespace {

struct Arrival {
  OpDesc desc;
  WorkPtr work;
};

// State every rank's LocalGroup object of one group shares.
struct SharedGroup {
  explicit SharedGroup(int n) : size(n) {}
  const int size;
  std::mutex mu;
  bool aborted = false;
  struct Slot {
    std::vector<std::optional<Arrival>> arrivals;
    int arrived = 0;
  };
  std::map<uint64_t, Slot> slots;             // collective seq -> who has arrived
  using Channel = std::tuple<int, int, int>;  // (src, dst, tag)
  std::map<Channel, std::deque<Arrival>> sends, recvs;
  std::map<std::pair<uint64_t, int>, std::shared_ptr<SharedGroup>> children;  // (split seq, color)
};

size_t bytes_of(const OpDesc& d, int64_t numel) { return static_cast<size_t>(numel) * dtype_size(d.dtype); }

// Run one collective over every rank's buffers. Other ranks' works are not
// complete yet, so their buffers stay valid while this runs.
void execute(std::vector<Arrival>& a) {
  const int n = static_cast<int>(a.size());
  const OpDesc& d0 = a[0].desc;
  std::vector<const void*> rows(static_cast<size_t>(n));
  switch (d0.op) {
    case OpType::barrier:
      return;
    case OpType::all_reduce: {
      std::vector<std::byte> result(bytes_of(d0, d0.in_numel));
      for (int k = 0; k < n; ++k) rows[k] = a[k].desc.in;
      reduce_rows(d0.dtype, d0.reduce, rows.data(), n, result.data(), static_cast<size_t>(d0.in_numel));
      if (!result.empty())
        for (auto& x : a) copy_bytes(x.desc.out, result.data(), result.size());
      return;
    }
    case OpType::all_gather: {
      if (!d0.members.empty()) {  // rank k's block of member m, from its input to every output
        const auto from = displacements(d0.members);
        for (int k = 0; k < n; ++k) {
          const auto to = d0.member_blocks_of_rank(n, k);
          for (int r = 0; r < n; ++r)
            for (size_t m = 0; m < to.size(); ++m)
              if (d0.members[m] > 0)
                move_bytes(static_cast<std::byte*>(a[r].desc.out) + bytes_of(d0, to[m]),
                           static_cast<const std::byte*>(a[k].desc.in) + bytes_of(d0, from[m]),
                           bytes_of(d0, d0.members[m]));
        }
        return;
      }
      const auto disp = displacements(d0.counts);
      for (int r = 0; r < n; ++r)
        for (int k = 0; k < n; ++k)
          move_bytes(static_cast<std::byte*>(a[r].desc.out) + bytes_of(d0, disp[k]), a[k].desc.in,
                     bytes_of(d0, d0.counts[k]));
      return;
    }
    case OpType::reduce_scatter: {
      if (!d0.members.empty()) {  // rank r's block of member m, reduced over every input
        const auto to = displacements(d0.members);
        for (int r = 0; r < n; ++r) {
          const auto from = d0.member_blocks_of_rank(n, r);
          for (size_t m = 0; m < from.size(); ++m) {
            for (int k = 0; k < n; ++k) rows[k] = static_cast<const std::byte*>(a[k].desc.in) + bytes_of(d0, from[m]);
            std::vector<std::byte> result(bytes_of(d0, d0.members[m]));
            reduce_rows(d0.dtype, d0.reduce, rows.data(), n, result.data(), static_cast<size_t>(d0.members[m]));
            if (!result.empty())
              copy_bytes(static_cast<std::byte*>(a[r].desc.out) + bytes_of(d0, to[m]), result.data(), result.size());
          }
        }
        return;
      }
      const auto disp = displacements(d0.counts);
      for (int r = 0; r < n; ++r) {
        for (int k = 0; k < n; ++k) rows[k] = static_cast<const std::byte*>(a[k].desc.in) + bytes_of(d0, disp[r]);
        std::vector<std::byte> result(bytes_of(d0, d0.counts[r]));
        reduce_rows(d0.dtype, d0.reduce, rows.data(), n, result.data(), static_cast<size_t>(d0.counts[r]));
        if (!result.empty()) copy_bytes(a[r].desc.out, result.data(), result.size());
      }
      return;
    }
    case OpType::all_to_all: {
      for (int r = 0; r < n; ++r) {
        const auto recv_disp = displacements(a[r].desc.recv_counts);
        for (int k = 0; k < n; ++k) {
          const auto send_disp = displacements(a[k].desc.send_counts);
          move_bytes(static_cast<std::byte*>(a[r].desc.out) + bytes_of(d0, recv_disp[k]),
                     static_cast<const std::byte*>(a[k].desc.in) + bytes_of(d0, send_disp[r]),
                     bytes_of(d0, a[k].desc.send_counts[r]));
        }
      }
      return;
    }
    case OpType::broadcast: {
      const void* src = a[d0.root].desc.in;
      for (int r = 0; r < n; ++r)
        if (r != d0.root) move_bytes(a[r].desc.out, src, bytes_of(d0, d0.in_numel));
      return;
    }
    case OpType::send:
    case OpType::recv:
      break;
  }
  throw Error("local backend: p2p operation reached the collective path");
}

class LocalGroup final : public ProcessGroup {
 public:
  LocalGroup(std::string name, int rank, std::vector<int> world_ranks, std::shared_ptr<FlightRecorder> recorder,
             GroupOptions options, std::shared_ptr<SharedGroup> shared)
      : ProcessGroup(std::move(name), rank, std::move(world_ranks), std::move(recorder), options),
        shared_(std::move(shared)) {}

  std::string_view backend_name() const override { return "local"; }

 protected:
  void start(std::shared_ptr<const OpDesc> shared_desc, const WorkPtr& work) override {
    const OpDesc& desc = *shared_desc;
    work->mark_started();
    std::unique_lock lock(shared_->mu);
    if (shared_->aborted) {
      work->fail(std::make_exception_ptr(
          CommError(fmt::format("{}: another rank of the group timed out and aborted it", work->info().describe()))));
      return;
    }
    if (is_p2p(desc.op)) return start_p2p(desc, work, lock);
    auto& slot = shared_->slots[desc.seq];
    if (slot.arrivals.empty()) slot.arrivals.resize(static_cast<size_t>(size()));
    slot.arrivals[rank()] = Arrival{desc, work};
    if (++slot.arrived < size()) return;
    std::vector<Arrival> all;
    for (auto& x : slot.arrivals) all.push_back(std::move(*x));
    shared_->slots.erase(desc.seq);
    lock.unlock();
    complete_collective(all);
  }

  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, uint64_t split_seq, int color,
                                              const std::string& name) override {
    if (color < 0) return nullptr;
    std::shared_ptr<SharedGroup> child;
    {
      std::lock_guard lock(shared_->mu);
      auto& slot = shared_->children[{split_seq, color}];
      if (!slot) slot = std::make_shared<SharedGroup>(static_cast<int>(members.size()));
      child = slot;
    }
    std::vector<int> world;
    int new_rank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      world.push_back(world_ranks()[members[i]]);
      if (members[i] == rank()) new_rank = static_cast<int>(i);
    }
    return std::make_shared<LocalGroup>(name, new_rank, std::move(world), recorder_ptr(), options(), std::move(child));
  }

  void on_abort() override {
    std::lock_guard lock(shared_->mu);
    shared_->aborted = true;
  }

 private:
  static void complete_collective(std::vector<Arrival>& all) {
    std::vector<std::vector<int64_t>> rows;
    const int n = static_cast<int>(all.size());
    for (auto& x : all) rows.push_back(x.desc.fingerprint(n));
    // Always checked here: executing mismatched buffers would corrupt memory.
    std::string problem = check_fingerprints(rows, all[0].work->info());
    if (problem.empty()) {
      try {
        execute(all);
      } catch (const std::exception& e) {
        problem = e.what();
      }
    }
    for (auto& x : all) {
      if (problem.empty())
        x.work->finish();
      else
        x.work->fail(std::make_exception_ptr(CommError(problem)));
    }
  }

  void start_p2p(const OpDesc& desc, const WorkPtr& work, std::unique_lock<std::mutex>& lock) {
    const bool sending = desc.op == OpType::send;
    const SharedGroup::Channel channel =
        sending ? SharedGroup::Channel{rank(), desc.peer, desc.tag} : SharedGroup::Channel{desc.peer, rank(), desc.tag};
    auto& waiting = sending ? shared_->recvs[channel] : shared_->sends[channel];
    if (waiting.empty()) {
      (sending ? shared_->sends : shared_->recvs)[channel].push_back(Arrival{desc, work});
      return;
    }
    Arrival peer = std::move(waiting.front());
    waiting.pop_front();
    lock.unlock();
    const OpDesc& s = sending ? desc : peer.desc;
    const OpDesc& r = sending ? peer.desc : desc;
    if (s.dtype != r.dtype || s.in_numel != r.out_numel) {
      const auto error = std::make_exception_ptr(
          CommError(fmt::format("send/recv mismatch on group '{}' (tag {}): rank {} sends {} x {} but rank {} receives "
                                "{} x {}",
                                name(), s.tag, std::get<0>(channel), s.in_numel, dtype_name(s.dtype),
                                std::get<1>(channel), r.out_numel, dtype_name(r.dtype))));
      work->fail(error);
      peer.work->fail(error);
      return;
    }
    move_bytes(r.out, s.in, bytes_of(s, s.in_numel));
    work->finish();
    peer.work->finish();
  }

  std::shared_ptr<SharedGroup> shared_;
};

}  // namespace

LocalWorld::LocalWorld(int size, GroupOptions options) {
  MT_CHECK(size >= 1, "LocalWorld needs at least one rank, got {}", size);
  auto shared = std::make_shared<SharedGroup>(size);
  std::vector<int> world(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) world[r] = r;
  for (int r = 0; r < size; ++r)
    groups_.push_back(
        std::make_shared<LocalGroup>("world", r, world, std::make_shared<FlightRecorder>(r, size), options, shared));
}

ProcessGroupPtr LocalWorld::group(int rank) const {
  MT_CHECK(rank >= 0 && rank < size(), "LocalWorld: rank {} outside 0..{}", rank, size() - 1);
  return groups_[rank];
}

void LocalWorld::run(const std::function<void(ProcessGroup&)>& fn) const {
  std::vector<std::exception_ptr> errors(groups_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < groups_.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*groups_[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  // One failing rank usually makes the others time out: report every rank.
  std::vector<std::string> messages;
  int failed = -1;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    if (failed < 0) failed = static_cast<int>(r);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      messages.push_back(fmt::format("rank {}: {}", r, e.what()));
    } catch (...) {
      messages.push_back(fmt::format("rank {}: unknown exception", r));
    }
  }
  if (messages.size() == 1) std::rethrow_exception(errors[failed]);
  if (!messages.empty())
    throw Error(fmt::format("{} ranks failed:\n  {}", messages.size(), fmt::join(messages, "\n  ")));
}

}  // namespace meshtrain::comm
