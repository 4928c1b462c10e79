#include "comm/mpi_backend.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <thread>

#include "comm/reduce.h"
#include "core/error.h"

namespace meshtrain::comm {

namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

int to_int_count(int64_t n, const char* what) {
  if (n > INT_MAX)
    throw CommError(
        fmt::format("{} of {} bytes exceeds MPI's 2 GiB count limit; split the "
                    "tensor into smaller pieces",
                    what, n));
  return static_cast<int>(n);
}

std::vector<int> byte_counts(const std::vector<int64_t>& counts, size_t elem, const char* what) {
  std::vector<int> out;
  out.reserve(counts.size());
  for (int64_t c : counts) out.push_back(to_int_count(c * static_cast<int64_t>(elem), what));
  return out;
}

std::vector<int> byte_displacements(const std::vector<int64_t>& counts, size_t elem, const char* what) {
  return byte_counts(displacements(counts), elem, what);
}

MPI_Datatype native_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::f64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op native_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI state of one group, shared by its ProcessGroup object and its in-flight ops.
struct GroupComm {
  MPI_Comm comm = MPI_COMM_NULL;        // the collectives themselves
  MPI_Comm check_comm = MPI_COMM_NULL;  // fingerprint exchange, ordered apart from `comm`
  int rank = 0;
  int size = 0;
  bool verify = true;
  bool aborted = false;
  // Ops whose next stage still has to be posted on `comm`. Only the head may
  // post, so that every rank posts in issue order whatever the timing.
  std::deque<struct MpiOp*> post_queue;
};

// One operation: an optional fingerprint check, then stages, each posting
// MPI requests and running a host step once they complete.
struct MpiOp {
  OpDesc desc;
  WorkPtr work;
  std::shared_ptr<GroupComm> group;
  struct Stage {
    std::function<int(MpiOp&, std::vector<MPI_Request>&)> post;  // returns an MPI error code
    std::function<void(MpiOp&)> after;                           // host step, may be empty
  };
  std::vector<Stage> stages;
  size_t next_stage = 0;
  std::vector<MPI_Request> requests;  // of the stage in flight
  bool checking = false;
  MPI_Request check_request = MPI_REQUEST_NULL;
  std::vector<int64_t> check_mine, check_all;
  std::vector<std::byte> scratch;
  // Committed for the requests of the stage in flight; freed with the op or
  // when a later stage starts.
  std::vector<MPI_Datatype> datatypes;
  // MPI_Ialltoallw's datatype arguments: Open MPI 4.1 reads the arrays again
  // when the request completes, so they live until the next stage.
  std::vector<MPI_Datatype> send_types, recv_types;
  MPI_Status status{};  // of the last p2p request
  bool in_post_queue = false;
  bool done = false;

  MpiOp() = default;
  MpiOp(const MpiOp&) = delete;
  MpiOp& operator=(const MpiOp&) = delete;
  ~MpiOp() { free_datatypes(); }
  void free_datatypes() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      for (MPI_Datatype& t : datatypes) MPI_Type_free(&t);
    datatypes.clear();
  }
};

class Engine {
 public:
  static Engine& get() {
    static Engine* engine = new Engine();  // lives until the process exits (atexit shuts it down)
    return *engine;
  }

  std::mutex& mu() { return mu_; }
  void set_background_progress(bool on) { background_progress_.store(on); }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  std::shared_ptr<FlightRecorder> recorder() const { return recorder_; }

  // Track an op (caller holds mu_). Queued ops post their stages in issue order.
  void add(std::unique_ptr<MpiOp> op, bool queue) {
    MpiOp* raw = op.get();
    active_.push_back(std::move(op));
    if (queue) {
      raw->group->post_queue.push_back(raw);
      raw->in_post_queue = true;
    }
    progress_locked();
  }

  // Called by threads waiting on a Work: they drive progress themselves, and
  // the progress thread stands back meanwhile (no lock or CPU contention).
  void poll() {
    last_wait_poll_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    std::lock_guard lock(mu_);
    progress_locked();
  }

  void abort_group(const std::shared_ptr<GroupComm>& group) {
    std::lock_guard lock(mu_);
    group->aborted = true;
    // Their MPI requests may never complete, or complete late into the op's
    // buffers: keep those ops alive (never freed) instead of dropping them.
    for (auto it = active_.begin(); it != active_.end();) {
      if ((*it)->group != group) {
        ++it;
        continue;
      }
      MpiOp& op = **it;
      if (!op.done)
        op.work->fail(std::make_exception_ptr(
            CommError(fmt::format("{}: the group was aborted after a timeout", op.work->info().describe()))));
      op.done = true;
      abandoned_.splice(abandoned_.end(), active_, it++);
    }
    for (MpiOp* op : group->post_queue) op->in_post_queue = false;
    group->post_queue.clear();
    any_aborted_ = true;
    request_peer_dumps_locked();
  }

  void shutdown() {
    {
      std::lock_guard lock(mu_);
      if (!initialized_) return;
      stop_ = true;
    }
    if (progress_thread_.joinable()) progress_thread_.join();
    if (any_aborted_) abort_now(1);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  [[noreturn]] void abort_now(int code) {
    // Peers that received a dump request need a moment to write their dumps.
    if (dump_requested_at_.time_since_epoch().count() != 0)
      std::this_thread::sleep_until(dump_requested_at_ + std::chrono::milliseconds(grace_ms()));
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  void init() {
    std::lock_guard lock(mu_);
    if (initialized_) return;
    int already = 0;
    MPI_Initialized(&already);
    int provided = 0;
    if (!already) {
      choose_nonblocking_schedules();
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
      throw CommError(
          "the MPI library does not provide MPI_THREAD_SERIALIZED, which the mpi "
          "backend needs for its progress thread");
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    MPI_Comm_dup(MPI_COMM_WORLD, &signal_comm_);
    MPI_Comm_set_errhandler(signal_comm_, MPI_ERRORS_RETURN);
    MPI_Irecv(&signal_in_, 1, MPI_INT, MPI_ANY_SOURCE, 0, signal_comm_, &signal_request_);
    recorder_ = std::make_shared<FlightRecorder>(world_rank_, world_size_);
    initialized_ = true;
    std::atexit([] { Engine::get().shutdown(); });
    progress_thread_ = std::thread([this] { progress_loop(); });
  }

 private:
  Engine() = default;

  // Open MPI's non-blocking collectives (libnbc) pick schedules that run well
  // below its blocking ones here (bench/comm.sh): all_reduce at half speed
  // with 2 ranks, all_gather 35% slower. Rabenseifner all_reduce matches or
  // beats the blocking call at 2 and 4 ranks; the linear all_gather does for
  // small jobs (it posts n-1 messages per rank, so only up to 8 ranks). The
  // user's own OMPI_MCA_* settings win.
  static void choose_nonblocking_schedules() {
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
    const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (world && std::atoi(world) <= 8) setenv("OMPI_MCA_coll_libnbc_iallgather_algorithm", "1", /*overwrite=*/0);
  }

  static int grace_ms() {
    const char* env = std::getenv("MESHTRAIN_FR_DUMP_GRACE_MS");
    return env ? std::atoi(env) : 2000;
  }

  void progress_loop() {
    using namespace std::chrono;
    const Clock::rep one_ms = Clock::duration(milliseconds(1)).count();
    for (;;) {
      std::vector<WorkPtr> expired;
      bool waiter_polling = false;
      {
        std::lock_guard lock(mu_);
        if (stop_) return;
        waiter_polling =
            Clock::now().time_since_epoch().count() - last_wait_poll_ns_.load(std::memory_order_relaxed) < one_ms;
        if (!waiter_polling) progress_locked();
        poll_signal_locked();
        const auto now = Clock::now();
        report_unfinished_after_stop_signal_locked(now);
        for (auto& op : active_)
          if (!op->done && op->work->deadline() <= now) expired.push_back(op->work);
      }
      // Outside the lock: the timeout handler aborts the group, which locks.
      for (auto& w : expired) w->is_completed();
      // Poll often only for ops that nobody waits on (background progress, so
      // that communication advances while the caller computes); otherwise
      // wake rarely, for dump requests and deadlines: every wake-up steals the
      // core from a rank that is busy-polling its own wait.
      const bool background = background_progress_.load() && active_count_.load() > 0 && !waiter_polling;
      std::this_thread::sleep_for(background ? microseconds(50) : milliseconds(10));
    }
  }

  // After a stop signal (mpirun sends SIGTERM to every rank when one dies),
  // a collective still unfinished kStopReportDelay later is named, with a
  // flight-recorder dump, before mpirun's SIGKILL: it is the op a dead rank
  // never joined. Once per process.
  void report_unfinished_after_stop_signal_locked(Clock::time_point now) {
    const int signal = noted_stop_signal();
    if (signal == 0 || stop_reported_) return;
    if (stop_seen_at_ == Clock::time_point{}) stop_seen_at_ = now;
    if (now - stop_seen_at_ < kStopReportDelay) return;
    stop_reported_ = true;
    const MpiOp* oldest = nullptr;
    for (const auto& op : active_)
      if (!op->done && (oldest == nullptr || op->work->issued_at() < oldest->work->issued_at())) oldest = op.get();
    if (oldest == nullptr) return;
    const WorkInfo& info = oldest->work->info();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - oldest->work->issued_at());
    std::string where;
    try {
      where = "; flight recorder dumped to " +
              recorder_->dump(FlightRecorder::default_dump_dir(),
                              fmt::format("{} unfinished {} ms after signal {}", info.describe(),
                                          kStopReportDelay.count(), signal));
    } catch (const std::exception& e) {
      where = fmt::format("; the flight recorder could not be dumped: {}", e.what());
    }
    std::fprintf(stderr,
                 "[meshtrain rank %d] %s has waited %lld ms for its other ranks and was still unfinished "
                 "%lld ms after this rank got signal %d (%s): if a rank died (mpirun then stops the job and names "
                 "it), this is the collective it never joined%s\n",
                 world_rank_, info.describe().c_str(), static_cast<long long>(waited.count()),
                 static_cast<long long>(kStopReportDelay.count()), signal, strsignal(signal), where.c_str());
  }

  // A peer timed out and asks every rank to write its flight recorder.
  void poll_signal_locked() {
    int flag = 0;
    MPI_Status status;
    if (MPI_Test(&signal_request_, &flag, &status) != MPI_SUCCESS || !flag) return;
    try {
      recorder_->dump(FlightRecorder::default_dump_dir(),
                      fmt::format("dump requested by world rank {} after its timeout", status.MPI_SOURCE));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[meshtrain rank %d] could not write flight recorder dump: %s\n", world_rank_, e.what());
    }
    MPI_Irecv(&signal_in_, 1, MPI_INT, MPI_ANY_SOURCE, 0, signal_comm_, &signal_request_);
  }

  void request_peer_dumps_locked() {
    if (dump_requested_at_.time_since_epoch().count() != 0) return;
    dump_requested_at_ = Clock::now();
    static int message = 1;
    for (int r = 0; r < world_size_; ++r) {
      if (r == world_rank_) continue;
      MPI_Request req;
      if (MPI_Isend(&message, 1, MPI_INT, r, 0, signal_comm_, &req) == MPI_SUCCESS) MPI_Request_free(&req);
    }
  }

  void fail(MpiOp& op, const std::string& message, bool breaks_group) {
    op.done = true;
    op.work->fail(std::make_exception_ptr(CommError(message)));
    if (breaks_group) op.group->aborted = true;
  }

  void complete(MpiOp& op) {
    op.done = true;
    op.work->finish();
  }

  // Advance every op as far as it goes without blocking. Holds mu_.
  void progress_locked() {
    bool changed = true;
    while (changed) {
      changed = false;
      for (auto& holder : active_) {
        MpiOp& op = *holder;
        if (op.done) continue;
        if (op.checking)
          changed |= test_check(op);
        else if (!op.requests.empty())
          changed |= test_stage(op);
      }
      for (auto& holder : active_) {
        MpiOp& op = *holder;
        // The head of a group's queue, done or not, unblocks the ops behind it.
        if (op.in_post_queue && op.group->post_queue.front() == &op) changed |= post_ready(*op.group);
      }
      const auto before = active_.size();
      std::erase_if(active_, [](const auto& op) { return op->done && !op->in_post_queue; });
      changed |= active_.size() != before;
    }
    active_count_.store(static_cast<int>(active_.size()));
  }

  bool test_check(MpiOp& op) {
    int flag = 0;
    const int rc = MPI_Test(&op.check_request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      fail(op, fmt::format("{}: fingerprint exchange failed: {}", op.work->info().describe(), mpi_error_text(rc)),
           true);
      return true;
    }
    if (!flag) return false;
    op.checking = false;
    const size_t width = op.check_mine.size();
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(op.group->size));
    for (int r = 0; r < op.group->size; ++r)
      rows[r].assign(op.check_all.begin() + r * width, op.check_all.begin() + (r + 1) * width);
    // Every rank holds the same table, so every rank decides alike and the
    // posting order on `comm` stays the same everywhere.
    const std::string problem = check_fingerprints(rows, op.work->info());
    if (!problem.empty()) fail(op, problem, false);
    return true;
  }

  bool test_stage(MpiOp& op) {
    int flag = 0;
    int rc;
    if (op.requests.size() == 1) {
      rc = MPI_Test(&op.requests[0], &flag, &op.status);
    } else {
      rc = MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &flag, MPI_STATUSES_IGNORE);
    }
    if (rc != MPI_SUCCESS) {
      fail(op, fmt::format("{} failed in MPI: {}", op.work->info().describe(), mpi_error_text(rc)),
           !is_p2p(op.desc.op));
      return true;
    }
    if (!flag) return false;
    op.requests.clear();
    const auto& stage = op.stages[op.next_stage - 1];
    try {
      if (stage.after) stage.after(op);
    } catch (const std::exception& e) {
      fail(op, e.what(), false);
      return true;
    }
    if (op.next_stage == op.stages.size()) complete(op);
    return true;
  }

  // Post stages of the ops at the head of the group's queue, in order.
  bool post_ready(GroupComm& group) {
    bool changed = false;
    while (!group.post_queue.empty()) {
      MpiOp& op = *group.post_queue.front();
      if (op.done) {  // failed its check: posts nothing more
        pop_head(group);
        changed = true;
        continue;
      }
      if (op.checking || !op.requests.empty()) break;
      if (op.next_stage == 0) op.work->mark_started();
      const auto& stage = op.stages[op.next_stage++];
      int rc;
      try {
        rc = stage.post(op, op.requests);
      } catch (const std::exception& e) {
        // Every rank raises the same error here (sizes agree), so none posts.
        fail(op, e.what(), false);
        pop_head(group);
        changed = true;
        continue;
      }
      changed = true;
      if (rc != MPI_SUCCESS) {
        fail(op, fmt::format("{} could not start in MPI: {}", op.work->info().describe(), mpi_error_text(rc)), true);
        pop_head(group);
        continue;
      }
      if (op.next_stage == op.stages.size()) {
        pop_head(group);
        continue;
      }
      break;  // the next stage waits for this one; later ops wait behind it
    }
    return changed;
  }

  static void pop_head(GroupComm& group) {
    group.post_queue.front()->in_post_queue = false;
    group.post_queue.pop_front();
  }

  std::mutex mu_;
  bool initialized_ = false;
  bool stop_ = false;
  bool any_aborted_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  std::list<std::unique_ptr<MpiOp>> active_;
  std::list<std::unique_ptr<MpiOp>> abandoned_;  // of aborted groups, see abort_group
  std::atomic<int> active_count_{0};
  std::atomic<bool> background_progress_{true};
  std::atomic<Clock::rep> last_wait_poll_ns_{0};
  std::thread progress_thread_;
  std::shared_ptr<FlightRecorder> recorder_;
  MPI_Comm signal_comm_ = MPI_COMM_NULL;
  MPI_Request signal_request_ = MPI_REQUEST_NULL;
  int signal_in_ = 0;
  Clock::time_point dump_requested_at_{};
  Clock::time_point stop_seen_at_{};  // when the progress thread first saw a noted stop signal
  bool stop_reported_ = false;
};

// ---- stage plans -----------------------------------------------------------

using Stage = MpiOp::Stage;

void scale_in_place(void* data, DType dtype, int64_t n, int divisor) {
  if (dtype == DType::f64) {
    auto* p = static_cast<double*>(data);
    for (int64_t i = 0; i < n; ++i) p[i] /= divisor;
    return;
  }
  // Only native reductions scale here (needs_host_reduction's dtypes average
  // in reduce_rows), and avg of an integer dtype is refused when issued.
  MT_ASSERT(dtype == DType::f32, "avg scaling on dtype {}", dtype_name(dtype));
  auto* p = static_cast<float*>(data);
  for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<float>(divisor);
}

// An all_reduce's buffer of `numel` elements split into one block per rank
// (the block that rank reduces): ceil(numel / n) each, the trailing blocks
// shorter or empty.
std::vector<int64_t> reduction_blocks(int64_t numel, int n) {
  // n: a group's size; numel: a tensor's.
  MT_ASSERT(n > 0 && numel >= 0, "reduction_blocks({}, {}): need n > 0 and numel >= 0", numel, n);
  const int64_t block = (numel + n - 1) / n;
  std::vector<int64_t> counts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) counts[r] = std::clamp<int64_t>(numel - block * r, 0, block);
  return counts;
}

// Byte runs (offset from the buffer, length) as one datatype (committed;
// the op frees it).
MPI_Datatype runs_type(MpiOp& op, const std::vector<std::pair<MPI_Aint, int>>& runs) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> offsets;
  for (const auto& [at, bytes] : runs) {
    offsets.push_back(at);
    lengths.push_back(bytes);
  }
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(), offsets.data(), MPI_BYTE, &t);
  MPI_Type_commit(&t);
  op.datatypes.push_back(t);
  return t;
}

// A reduction's blocks move and are summed in segments: each rank receives
// about this many bytes per segment from all its peers together, so that the
// rows stay in cache between arriving and being summed (bench comm, 4 ranks
// of a 2-core host, a 16 MiB reduce_scatter: 23.4 ms in one piece, 11.5 ms in
// 1 MiB segments, 13.2 ms in 256 KiB ones); but at least kMinSegmentPiece
// bytes from each peer, lest a large group's segments be all latency.
constexpr int64_t kReduceSegmentBytes = 1 << 20, kMinSegmentPiece = 128 << 10;

// The elements [lo, hi) of rank r's block, as byte runs (offset, length)
// of the full side: one run of a plain op's block, or a coalesced op's runs
// in each member the range crosses.
std::vector<std::pair<MPI_Aint, int>> block_runs(const OpDesc& d, const std::vector<int64_t>& counts, int n, int r,
                                                 int64_t lo, int64_t hi) {
  const auto elem = static_cast<int64_t>(dtype_size(d.dtype));
  const std::string what = fmt::format("{}'s block of rank {}", op_type_name(d.op), r);
  std::vector<std::pair<MPI_Aint, int>> runs;
  auto add = [&](int64_t at, int64_t len) {
    if (len > 0) runs.emplace_back(static_cast<MPI_Aint>(at * elem), to_int_count(len * elem, what.c_str()));
  };
  if (d.members.empty()) {
    add(displacements(counts)[r] + lo, hi - lo);
    return runs;
  }
  const std::vector<int64_t> starts = d.member_blocks_of_rank(n, r);
  int64_t in_block = 0;  // where member m's block starts within rank r's block
  for (size_t m = 0; m < d.members.size(); ++m) {
    const int64_t from = std::max(lo, in_block), to = std::min(hi, in_block + d.members[m]);
    add(starts[m] + from - in_block, to - from);
    in_block += d.members[m];
  }
  return runs;
}

// A coalesced all_gather: every rank sends its input whole to every rank,
// which receives rank r's blocks straight into the members' places (one
// datatype per rank), so nothing is packed or unpacked.
int post_coalesced_all_gather(MpiOp& op, std::vector<MPI_Request>& reqs) {
  const int n = op.group->size;
  const int bytes =
      to_int_count(op.desc.in_numel * static_cast<int64_t>(dtype_size(op.desc.dtype)), "all_gather block");
  std::vector<int> send_counts(static_cast<size_t>(n), bytes), ones(static_cast<size_t>(n), 1),
      zeros(static_cast<size_t>(n), 0);
  op.send_types.assign(static_cast<size_t>(n), MPI_BYTE);
  op.recv_types.clear();
  for (int r = 0; r < n; ++r)
    op.recv_types.push_back(runs_type(op, block_runs(op.desc, op.desc.counts, n, r, 0, op.desc.in_numel)));
  reqs.resize(1);
  return MPI_Ialltoallw(op.desc.in, send_counts.data(), zeros.data(), op.send_types.data(), op.desc.out, ones.data(),
                        zeros.data(), op.recv_types.data(), op.group->comm, &reqs[0]);
}

// all_to_all the blocks, reduce on the host in rank order (bf16/f16/fp8 in
// f32 with one rounding), so the result equals a serial reduction, segment
// by segment (kReduceSegmentBytes); all_reduce then all_gathers the reduced
// blocks. Same bytes on the wire as a ring all_reduce. A segment's pieces of
// each rank's block go as one datatype, straight from the input (a
// coalesced op's from each member's place).
std::vector<Stage> host_reduce_stages(const OpDesc& d, int n, int rank, bool gather_back) {
  const size_t elem = dtype_size(d.dtype);
  const std::vector<int64_t> counts = d.op == OpType::all_reduce ? reduction_blocks(d.in_numel, n) : d.counts;
  const int64_t mine = counts[rank];
  // Every rank cuts every block alike, so all post the same segments.
  const int64_t segment =
      std::max<int64_t>(1, std::max(kReduceSegmentBytes / n, kMinSegmentPiece) / static_cast<int64_t>(elem));
  const int64_t largest = *std::max_element(counts.begin(), counts.end());
  const int64_t segments = std::max<int64_t>(1, (largest + segment - 1) / segment);
  const int64_t out_base = d.op == OpType::all_reduce ? displacements(counts)[rank] : 0;
  std::vector<Stage> stages;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t lo = s * segment, hi = lo + segment;
    const int64_t my_lo = std::min(mine, lo), my_len = std::min(mine, hi) - my_lo;
    stages.push_back(Stage{
        [counts, lo, hi, my_len, elem, n](MpiOp& op, std::vector<MPI_Request>& reqs) {
          op.scratch.resize(static_cast<size_t>(my_len * n) * elem);
          op.free_datatypes();  // the previous segment's request has completed
          op.send_types.clear();
          op.recv_types.assign(static_cast<size_t>(n), MPI_BYTE);
          std::vector<int> send_counts, zeros(static_cast<size_t>(n), 0), recv_counts, recv_displs;
          for (int r = 0; r < n; ++r) {
            const auto runs = block_runs(op.desc, counts, n, r, std::min(counts[r], lo), std::min(counts[r], hi));
            send_counts.push_back(runs.empty() ? 0 : 1);
            op.send_types.push_back(runs.empty() ? MPI_BYTE : runs_type(op, runs));
            recv_counts.push_back(to_int_count(my_len * static_cast<int64_t>(elem), "all_to_all block"));
            recv_displs.push_back(to_int_count(r * my_len * static_cast<int64_t>(elem), "all_to_all offset"));
          }
          reqs.resize(1);
          return MPI_Ialltoallw(op.desc.in, send_counts.data(), zeros.data(), op.send_types.data(), op.scratch.data(),
                                recv_counts.data(), recv_displs.data(), op.recv_types.data(), op.group->comm, &reqs[0]);
        },
        [my_lo, my_len, out_base, elem, n](MpiOp& op) {
          std::vector<const void*> rows(static_cast<size_t>(n));
          for (int k = 0; k < n; ++k) rows[k] = op.scratch.data() + static_cast<size_t>(k * my_len) * elem;
          void* out = static_cast<std::byte*>(op.desc.out) + (out_base + my_lo) * static_cast<int64_t>(elem);
          reduce_rows(op.desc.dtype, op.desc.reduce, rows.data(), n, out, static_cast<size_t>(my_len));
        }});
  }
  if (gather_back)
    stages.push_back(Stage{[counts, elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
                             const auto c = byte_counts(counts, elem, "all_gather block");
                             const auto displs = byte_displacements(counts, elem, "all_gather offset");
                             reqs.resize(1);
                             return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, op.desc.out, c.data(), displs.data(),
                                                    MPI_BYTE, op.group->comm, &reqs[0]);
                           },
                           nullptr});
  return stages;
}

std::vector<Stage> plan_stages(const OpDesc& d, int n, int rank) {
  const size_t elem = dtype_size(d.dtype);
  auto single = [](auto post) { return std::vector<Stage>{Stage{post, nullptr}}; };
  auto scale_if_avg = [n](MpiOp& op) {
    if (op.desc.reduce == ReduceOp::avg) scale_in_place(op.desc.out, op.desc.dtype, op.desc.out_numel, n);
  };
  switch (d.op) {
    case OpType::barrier:
      return single([](MpiOp& op, std::vector<MPI_Request>& reqs) {
        reqs.resize(1);
        return MPI_Ibarrier(op.group->comm, &reqs[0]);
      });
    case OpType::all_reduce:
      if (needs_host_reduction(d.dtype)) return host_reduce_stages(d, n, rank, true);
      return {Stage{[](MpiOp& op, std::vector<MPI_Request>& reqs) {
                      reqs.resize(1);
                      return MPI_Iallreduce(MPI_IN_PLACE, op.desc.out, to_int_count(op.desc.out_numel, "all_reduce"),
                                            native_type(op.desc.dtype), native_op(op.desc.reduce), op.group->comm,
                                            &reqs[0]);
                    },
                    scale_if_avg}};
    case OpType::reduce_scatter:
      // Every dtype: Open MPI's non-blocking reduce_scatter schedule runs
      // well below the blocking call, while all_to_all + one host reduction
      // moves the same bytes and sums in rank order (reproducible results).
      return host_reduce_stages(d, n, rank, false);
    case OpType::all_gather:
      if (!d.members.empty()) return single(post_coalesced_all_gather);
      return single([elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
        reqs.resize(1);
        const auto& c = op.desc.counts;
        if (std::all_of(c.begin(), c.end(), [&](int64_t x) { return x == c[0]; })) {
          const int bytes = to_int_count(c[0] * static_cast<int64_t>(elem), "all_gather block");
          return MPI_Iallgather(op.desc.in, bytes, MPI_BYTE, op.desc.out, bytes, MPI_BYTE, op.group->comm, &reqs[0]);
        }
        const auto bc = byte_counts(c, elem, "all_gather block");
        const auto bd = byte_displacements(c, elem, "all_gather offset");
        return MPI_Iallgatherv(op.desc.in, bc[op.group->rank], MPI_BYTE, op.desc.out, bc.data(), bd.data(), MPI_BYTE,
                               op.group->comm, &reqs[0]);
      });
    case OpType::all_to_all:
      return single([elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
        reqs.resize(1);
        const auto sc = byte_counts(op.desc.send_counts, elem, "all_to_all block");
        const auto sd = byte_displacements(op.desc.send_counts, elem, "all_to_all offset");
        const auto rc = byte_counts(op.desc.recv_counts, elem, "all_to_all block");
        const auto rd = byte_displacements(op.desc.recv_counts, elem, "all_to_all offset");
        // Not decided from this rank's counts: a rank whose blocks happen to be
        // equal (all empty, say) must still make the same call as its peers.
        if (op.desc.equal_blocks)
          return MPI_Ialltoall(op.desc.in, sc[0], MPI_BYTE, op.desc.out, sc[0], MPI_BYTE, op.group->comm, &reqs[0]);
        return MPI_Ialltoallv(op.desc.in, sc.data(), sd.data(), MPI_BYTE, op.desc.out, rc.data(), rd.data(), MPI_BYTE,
                              op.group->comm, &reqs[0]);
      });
    case OpType::broadcast:
      return single([elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
        reqs.resize(1);
        return MPI_Ibcast(op.desc.out, to_int_count(op.desc.in_numel * static_cast<int64_t>(elem), "broadcast"),
                          MPI_BYTE, op.desc.root, op.group->comm, &reqs[0]);
      });
    case OpType::send:
      return single([elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
        reqs.resize(1);
        return MPI_Isend(op.desc.in, to_int_count(op.desc.in_numel * static_cast<int64_t>(elem), "send"), MPI_BYTE,
                         op.desc.peer, op.desc.tag, op.group->comm, &reqs[0]);
      });
    case OpType::recv:
      return {Stage{[elem](MpiOp& op, std::vector<MPI_Request>& reqs) {
                      reqs.resize(1);
                      return MPI_Irecv(op.desc.out,
                                       to_int_count(op.desc.out_numel * static_cast<int64_t>(elem), "recv"), MPI_BYTE,
                                       op.desc.peer, op.desc.tag, op.group->comm, &reqs[0]);
                    },
                    [elem](MpiOp& op) {
                      int got = 0;
                      MPI_Get_count(&op.status, MPI_BYTE, &got);
                      const int64_t expected = op.desc.out_numel * static_cast<int64_t>(elem);
                      if (got != expected)
                        throw CommError(
                            fmt::format("{}: received {} bytes from rank {} but expected {} ({} x {}); the "
                                        "sender's tensor has a different size or dtype",
                                        op.work->info().describe(), got, op.desc.peer, expected, op.desc.out_numel,
                                        dtype_name(op.desc.dtype)));
                    }}};
  }
  return {};
}

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(std::string name, int rank, std::vector<int> world_ranks, GroupOptions options,
           std::shared_ptr<GroupComm> comm)
      : ProcessGroup(std::move(name), rank, std::move(world_ranks), Engine::get().recorder(), options),
        comm_(std::move(comm)) {}

  std::string_view backend_name() const override { return "mpi"; }

 protected:
  void start(std::shared_ptr<const OpDesc> shared_desc, const WorkPtr& work) override {
    const OpDesc& desc = *shared_desc;
    auto op = std::make_unique<MpiOp>();
    op->desc = desc;
    op->work = work;
    op->group = comm_;
    op->stages = plan_stages(desc, size(), rank());
    Engine& engine = Engine::get();
    work->set_poller([&engine] { engine.poll(); });
    std::lock_guard lock(engine.mu());
    if (comm_->aborted)
      throw CommError(fmt::format("{}: the group was aborted after an earlier failure", work->info().describe()));
    if (comm_->verify && !is_p2p(desc.op)) {
      op->checking = true;
      op->check_mine = desc.fingerprint(size());
      op->check_all.resize(op->check_mine.size() * static_cast<size_t>(size()));
      const int rc = MPI_Iallgather(op->check_mine.data(), static_cast<int>(op->check_mine.size()), MPI_INT64_T,
                                    op->check_all.data(), static_cast<int>(op->check_mine.size()), MPI_INT64_T,
                                    comm_->check_comm, &op->check_request);
      if (rc != MPI_SUCCESS)
        throw CommError(
            fmt::format("{}: fingerprint exchange could not start: {}", work->info().describe(), mpi_error_text(rc)));
    }
    if (is_p2p(desc.op)) {
      // p2p is not ordered against collectives: post at once, outside the queue.
      work->mark_started();
      const int rc = op->stages[0].post(*op, op->requests);
      if (rc != MPI_SUCCESS)
        throw CommError(fmt::format("{} could not start in MPI: {}", work->info().describe(), mpi_error_text(rc)));
      op->next_stage = 1;
      engine.add(std::move(op), /*queue=*/false);
      return;
    }
    engine.add(std::move(op), /*queue=*/true);
  }

  std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& members, uint64_t split_seq, int color,
                                              const std::string& name) override {
    auto child = std::make_shared<GroupComm>();
    int key = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank()) key = static_cast<int>(i);
    {
      std::lock_guard lock(Engine::get().mu());
      // Every rank reached here right after the split's all_gather completed,
      // so the blocking MPI_Comm_split cannot wait on an absent rank.
      int rc = MPI_Comm_split(comm_->comm, color < 0 ? MPI_UNDEFINED : color, key, &child->comm);
      if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split(comm_->check_comm, color < 0 ? MPI_UNDEFINED : color, key, &child->check_comm);
      if (rc != MPI_SUCCESS)
        throw CommError(fmt::format("splitting group '{}' (split seq {}) failed in MPI: {}", this->name(), split_seq,
                                    mpi_error_text(rc)));
    }
    if (color < 0) return nullptr;
    MPI_Comm_set_errhandler(child->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(child->check_comm, MPI_ERRORS_RETURN);
    child->rank = key;
    child->size = static_cast<int>(members.size());
    child->verify = comm_->verify;
    std::vector<int> world;
    for (int m : members) world.push_back(world_ranks()[m]);
    return std::make_shared<MpiGroup>(name, key, std::move(world), options(), std::move(child));
  }

  void on_abort() override { Engine::get().abort_group(comm_); }

 private:
  std::shared_ptr<GroupComm> comm_;
};

}  // namespace

namespace {
// The fingerprint check is a protocol every rank must speak: a rank started
// with --no-verify and one without would wait for each other forever.
void check_same_verify(bool verify, int rank) {
  int mine = verify ? 1 : 0, low = 0, high = 0;
  {
    std::lock_guard lock(Engine::get().mu());
    MPI_Allreduce(&mine, &low, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &high, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  if (low == high) return;
  const std::string message =
      "--no-verify is given to some ranks and not to others: every rank must take the same command-line flags";
  if (rank != 0) {
    std::lock_guard lock(Engine::get().mu());
    MPI_Barrier(MPI_COMM_WORLD);  // until rank 0 ends the job
    throw Error(message);
  }
  throw InvalidArgument(message);
}
}  // namespace

ProcessGroupPtr create_mpi_world(GroupOptions options) {
  Engine& engine = Engine::get();
  engine.init();
  check_same_verify(options.verify, engine.world_rank());
  engine.set_background_progress(options.background_progress);
  auto comm = std::make_shared<GroupComm>();
  {
    std::lock_guard lock(engine.mu());
    MPI_Comm_dup(MPI_COMM_WORLD, &comm->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm->check_comm);
  }
  MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(comm->check_comm, MPI_ERRORS_RETURN);
  comm->rank = engine.world_rank();
  comm->size = engine.world_size();
  comm->verify = options.verify;
  std::vector<int> world(static_cast<size_t>(engine.world_size()));
  for (int r = 0; r < engine.world_size(); ++r) world[r] = r;
  return std::make_shared<MpiGroup>("world", engine.world_rank(), std::move(world), options, std::move(comm));
}

std::mutex& mpi_mutex() { return Engine::get().mu(); }

void mpi_abort_job(int code) { Engine::get().abort_now(code); }

LaunchedRank launched_rank() {
  auto read = [](std::initializer_list<const char*> names) -> int {
    for (const char* name : names)
      if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::atoi(v);
    return -1;
  };
  const int size = read({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"});
  const int rank = read({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"});
  if (size < 1 || rank < 0) return {};
  const int local_size = read({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"});
  return {size, rank, local_size >= 1 ? local_size : size};
}

bool mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

void plain_mpi_collective(OpType op, Tensor& in, Tensor& out) {
  int rc;
  int size = 1;
  switch (op) {
    case OpType::all_reduce:
      rc = MPI_Allreduce(MPI_IN_PLACE, in.raw(), static_cast<int>(in.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case OpType::all_gather:
      rc = MPI_Allgather(in.raw(), static_cast<int>(in.nbytes()), MPI_BYTE, out.raw(), static_cast<int>(in.nbytes()),
                         MPI_BYTE, MPI_COMM_WORLD);
      break;
    case OpType::reduce_scatter:
      rc = MPI_Reduce_scatter_block(in.raw(), out.raw(), static_cast<int>(out.numel()), MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
      break;
    case OpType::all_to_all:
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      rc = MPI_Alltoall(in.raw(), static_cast<int>(in.nbytes() / size), MPI_BYTE, out.raw(),
                        static_cast<int>(in.nbytes() / size), MPI_BYTE, MPI_COMM_WORLD);
      break;
    default:
      throw InvalidArgument(fmt::format("plain_mpi_collective: no baseline for {}", op_type_name(op)));
  }
  if (rc != MPI_SUCCESS) throw CommError(fmt::format("plain MPI {} failed (code {})", op_type_name(op), rc));
}

void plain_mpi_all_to_allv(const Tensor& in, Tensor& out, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts) {
  auto ints = [](const std::vector<int64_t>& v) { return std::vector<int>(v.begin(), v.end()); };
  auto offsets = [&](const std::vector<int64_t>& v) { return ints(displacements(v)); };
  const std::vector<int> sc = ints(send_counts), sd = offsets(send_counts), rc = ints(recv_counts),
                         rd = offsets(recv_counts);
  const int code = MPI_Alltoallv(in.raw(), sc.data(), sd.data(), MPI_FLOAT, out.raw(), rc.data(), rd.data(), MPI_FLOAT,
                                 MPI_COMM_WORLD);
  if (code != MPI_SUCCESS) throw CommError(fmt::format("plain MPI all_to_allv failed (code {})", code));
}

}  // namespace meshtrain::comm
