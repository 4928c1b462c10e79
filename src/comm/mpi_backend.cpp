#include "comm/mpi_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <string_view>
#include <thread>

#include "comm/mpi_op.h"
#include "comm/reduce.h"
#include "core/copy.h"
#include "core/error.h"

namespace meshtrain::comm {

namespace {

using mpi::GroupComm;
using mpi::MpiOp;
using mpi::Piece;
using mpi::Pieces;
using mpi::Stage;

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
  int tag_ub() const { return tag_ub_; }
  std::shared_ptr<FlightRecorder> recorder() const { return recorder_; }

  // An op to fill, then start (caller holds mu_): one a done op left, so
  // that its memory serves again, or a new one.
  MpiOp& spare_op() {
    if (spare_ops_.empty()) spare_ops_.push_back(std::make_unique<MpiOp>());
    MpiOp& op = *spare_ops_.front();
    if (op.desc) op.recycle();  // an op that failed to start left its fields (a done one was recycled)
    return op;
  }

  // Track the op spare_op() gave and post what it may (caller holds mu_);
  // testing waits for a poll. Queued ops post their ordered stages in issue
  // order.
  void start_spare(bool queue) {
    MpiOp& op = *spare_ops_.front();
    active_.splice(active_.end(), spare_ops_, spare_ops_.begin());
    if (queue) {
      op.group->post_queue.push_back(&op);
      op.in_post_queue = true;
    }
    post_next(op);
  }

  // Called by threads waiting on a Work: they drive progress themselves, and
  // the progress thread stands back meanwhile (no lock or CPU contention).
  // Returns whether anything advanced.
  bool poll() {
    // Only whether it changed matters (progress_loop): a plain increment,
    // not a locked one, as concurrent waiters may lose a count harmlessly.
    wait_polls_.store(wait_polls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    bool advanced = false, called_mpi = false;
    {
      std::lock_guard lock(mu_);
      tested_mpi_ = false;
      advanced = progress_locked();
      called_mpi = tested_mpi_;
    }
    // An idle MPI test yields the core itself where ranks share cores (Open
    // MPI's yield_when_idle); a poll that waited on shared memory alone does
    // the same, for the rank whose message it waits for may need this core.
    if (!advanced && !called_mpi && yield_when_idle_) std::this_thread::yield();
    return advanced;
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
    int* tag_ub = nullptr;
    int has_tag_ub = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &has_tag_ub);
    if (has_tag_ub) tag_ub_ = *tag_ub;
    yield_when_idle_ = ranks_share_cores();
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

  // Open MPI's non-blocking all_reduce (libnbc) picks schedules that run well
  // below its blocking one here (bench/comm.sh): half speed with 2 ranks;
  // Rabenseifner's matches or beats the blocking call at 2 and 4 ranks (for
  // f32/f64/i32/i64 all_reduces of 128 KiB and more, see mpi_plans.cpp). The
  // user's own OMPI_MCA_* settings win.
  static void choose_nonblocking_schedules() {
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
  }

  // Whether this host runs more of the job's ranks than it has cores, as
  // Open MPI's launcher tells its ranks (mpi_yield_when_idle, else
  // mpi_oversubscribe), or as counted where another launcher started them.
  static bool ranks_share_cores() {
    auto flag = [](const char* name) -> int {
      const char* v = std::getenv(name);
      if (v == nullptr || *v == '\0') return -1;
      return std::string_view(v) == "1" || std::string_view(v) == "true" ? 1 : 0;
    };
    if (const int yield = flag("OMPI_MCA_mpi_yield_when_idle"); yield >= 0) return yield == 1;
    if (const int over = flag("OMPI_MCA_mpi_oversubscribe"); over >= 0) return over == 1;
    return launched_rank().local_size > static_cast<int>(std::thread::hardware_concurrency());
  }

  static int grace_ms() {
    const char* env = std::getenv("MESHTRAIN_FR_DUMP_GRACE_MS");
    return env ? std::atoi(env) : 2000;
  }

  void progress_loop() {
    using namespace std::chrono;
    uint64_t seen_polls = 0;
    for (auto woke = Clock::now();;) {
      std::vector<WorkPtr> expired;
      bool waiter_polling = false;
      {
        std::lock_guard lock(mu_);
        if (stop_) return;
        // A thread waiting on a Work polled since this thread last looked.
        const uint64_t polls = wait_polls_.load(std::memory_order_relaxed);
        waiter_polling = polls != seen_polls;
        seen_polls = polls;
        if (!waiter_polling) progress_locked();
        poll_signal_locked();
        const auto now = woke = note_pause(woke, Clock::now());
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

  // Test every op once and post the stages that may go next (ops are in
  // issue order, so an op that leaves the head of its group's post queue
  // unblocks those behind it in the same pass). Returns whether anything
  // advanced. Holds mu_.
  bool progress_locked() {
    bool advanced = false;
    for (auto& holder : active_) {
      MpiOp& op = *holder;
      if (!op.done && op.in_flight) advanced |= test_stage(op);
      advanced |= post_next(op);
    }
    for (auto it = active_.begin(); it != active_.end();) {
      if (!(*it)->done || (*it)->in_post_queue) {
        ++it;
        continue;
      }
      if ((*it)->requests_outstanding()) {
        // Failed with MPI requests still posted (an MPI error mid-stage):
        // they may yet read or write the op's scratch and first-stage
        // buffers, so the op is kept, never reused, as abort_group keeps its.
        abandoned_.splice(abandoned_.end(), active_, it++);
        continue;
      }
      (*it)->recycle();
      spare_ops_.splice(spare_ops_.begin(), active_, it++);
    }
    active_count_.store(static_cast<int>(active_.size()));
    return advanced;
  }

  // Test the stage in flight; once all its requests have completed, its host
  // step runs. Returns whether any request completed.
  bool test_stage(MpiOp& op) {
    const bool heard = op.first && op.first->via_shm() && op.first->poll_shm(op);
    int completed = 0;
    int rc = MPI_SUCCESS;
    if (op.pending > 0) {
      tested_mpi_ = true;
      if (op.requests.size() == 1 && !op.first) {
        rc = MPI_Test(&op.requests[0], &completed, &op.status);
      } else {
        indices_.resize(op.requests.size());
        statuses_.resize(op.requests.size());
        rc = MPI_Testsome(static_cast<int>(op.requests.size()), op.requests.data(), &completed, indices_.data(),
                          op.first ? statuses_.data() : MPI_STATUSES_IGNORE);
        if (completed == MPI_UNDEFINED) completed = 0;
      }
    }
    op.pending -= completed;
    if (op.first) {
      op.first->note(op, indices_.data(), statuses_.data(), completed, rc);
    } else if (rc != MPI_SUCCESS) {
      fail(op, fmt::format("{} failed in MPI: {}", op.work->info().describe(), mpi::error_text(rc)),
           !is_p2p(op.desc->op));
      return true;
    }
    if (op.pending > 0 || (op.first && op.first->unheard() > 0)) return heard || completed > 0;
    if (op.first) return end_first_stage(op);
    finish_stage(op);
    return true;
  }

  bool end_first_stage(MpiOp& op) {
    bool breaks_group = false;
    const std::string problem = op.first->finish(op, breaks_group);
    op.first = nullptr;
    if (problem.empty())
      finish_stage(op);
    else
      fail(op, problem, breaks_group);
    return true;
  }

  void finish_stage(MpiOp& op) {
    op.requests.clear();
    op.in_flight = false;
    const auto& stage = op.stages[op.next_stage - 1];
    try {
      if (stage.after) stage.after(op);
    } catch (const std::exception& e) {
      fail(op, e.what(), false);
      return;
    }
    if (op.next_stage == op.stages.size()) complete(op);
  }

  // Post the op's next stage where nothing holds it back: a pairwise stage at
  // once, an ordered one from the head of its group's post queue (a done op
  // there leaves it, unblocking those behind).
  bool post_next(MpiOp& op) {
    GroupComm& group = *op.group;
    const bool head = op.in_post_queue && group.post_queue.front() == &op;
    if (op.done) {
      if (head) pop_head(group);
      return head;
    }
    if (op.in_flight || op.next_stage == op.stages.size()) return false;
    if (!op.stages[op.next_stage].pairwise() && !head) return false;
    if (op.next_stage == 0 && op.first && !mpi::FirstStage::may_post(op)) return false;
    post_stage(op);
    if (op.in_post_queue && !op.done && !op.ordered_stage_ahead()) pop_head(group);
    return true;
  }

  void post_stage(MpiOp& op) {
    const size_t index = op.next_stage++;
    const Stage& stage = op.stages[index];
    if (index == 0) op.work->mark_started();
    op.in_flight = true;
    int rc;
    try {
      rc = stage.pairwise() ? post_pairwise(op, stage) : post_ordered(op, stage);
    } catch (const std::exception& e) {
      // Every rank raises the same error here (sizes agree), so none posts.
      fail(op, e.what(), false);
      return;
    }
    if (rc != MPI_SUCCESS)
      fail(op, fmt::format("{} could not start in MPI: {}", op.work->info().describe(), mpi::error_text(rc)), true);
  }

  static int post_ordered(MpiOp& op, const Stage& stage) {
    const int rc = stage.post(op, op.requests);
    op.pending = static_cast<int>(op.requests.size());
    return rc;
  }

  // Post a pairwise stage: one message each way with every other rank, on
  // `exchange` (the first stage of a verifying group's collective: see
  // FirstStage).
  int post_pairwise(MpiOp& op, const Stage& stage) {
    GroupComm& g = *op.group;
    std::string local_error;
    const Pieces& p = lay_out(op, stage, local_error);
    const int tag = g.exchange_tag(op.desc->seq);
    const int posted = op.first ? op.first->post(op, p, std::move(local_error)) : post_messages(op, p, tag);
    if (posted != MPI_SUCCESS) return posted;
    return copy_to_self(p.send[g.rank], p.recv[g.rank], g, tag);
  }

  // A pairwise stage's messages: every receive first, so that no message
  // arrives before its receive.
  static int post_messages(MpiOp& op, const Pieces& p, int tag) {
    const GroupComm& g = *op.group;
    op.requests.assign(static_cast<size_t>(2 * (g.size - 1)), MPI_REQUEST_NULL);
    MPI_Request* req = op.requests.data();
    int rc = MPI_SUCCESS;
    for (int r = 0; r < g.size && rc == MPI_SUCCESS; ++r)
      if (r != g.rank) rc = MPI_Irecv(p.recv[r].at, p.recv[r].count, p.recv[r].type, r, tag, g.exchange, req++);
    for (int r = 0; r < g.size && rc == MPI_SUCCESS; ++r)
      if (r != g.rank) rc = MPI_Isend(p.send[r].at, p.send[r].count, p.send[r].type, r, tag, g.exchange, req++);
    op.pending = static_cast<int>(req - op.requests.data());
    return rc;
  }

  // The stage's pieces. Where the first stage of a verifying group cannot
  // lay out this rank's part, its peers still count on its messages: it
  // sends and expects empty ones, and every rank fails (FirstStage).
  const Pieces& lay_out(MpiOp& op, const Stage& stage, std::string& local_error) {
    const auto n = static_cast<size_t>(op.group->size);
    pieces_.send.assign(n, Piece{});
    pieces_.recv.assign(n, Piece{});
    try {
      stage.pieces(op, pieces_);
    } catch (const std::exception& e) {
      if (!op.first) throw;
      local_error = e.what();
      pieces_.send.assign(n, Piece{});
      pieces_.recv.assign(n, Piece{});
    }
    return pieces_;
  }

  static int copy_to_self(const Piece& from, const Piece& to, const GroupComm& g, int tag) {
    if (from.count == 0 && to.count == 0) return MPI_SUCCESS;
    if (from.type != MPI_BYTE || to.type != MPI_BYTE)
      return MPI_Sendrecv(from.at, from.count, from.type, g.rank, tag, to.at, to.count, to.type, g.rank, tag,
                          g.exchange, MPI_STATUS_IGNORE);
    move_bytes(to.at, from.at, static_cast<size_t>(std::min(from.count, to.count)));
    return MPI_SUCCESS;
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
  int tag_ub_ = 32767;                // the largest tag MPI allows (the standard promises at least 32767)
  Pieces pieces_;                     // of the pairwise stage being posted
  std::vector<int> indices_;          // MPI_Testsome's
  std::vector<MPI_Status> statuses_;  // MPI_Testsome's
  std::list<std::unique_ptr<MpiOp>> active_;
  std::list<std::unique_ptr<MpiOp>> abandoned_;  // of aborted groups, see abort_group
  std::list<std::unique_ptr<MpiOp>> spare_ops_;  // done, for spare_op to hand out again
  std::atomic<int> active_count_{0};
  bool yield_when_idle_ = false;  // ranks_share_cores()
  bool tested_mpi_ = false;       // progress_locked tested an MPI request (a poll's)
  std::atomic<bool> background_progress_{true};
  std::atomic<uint64_t> wait_polls_{0};
  std::thread progress_thread_;
  std::shared_ptr<FlightRecorder> recorder_;
  MPI_Comm signal_comm_ = MPI_COMM_NULL;
  MPI_Request signal_request_ = MPI_REQUEST_NULL;
  int signal_in_ = 0;
  Clock::time_point dump_requested_at_{};
  Clock::time_point stop_seen_at_{};  // when the progress thread first saw a noted stop signal
  bool stop_reported_ = false;
};

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(std::string name, int rank, std::vector<int> world_ranks, GroupOptions options,
           std::shared_ptr<GroupComm> comm)
      : ProcessGroup(std::move(name), rank, std::move(world_ranks), Engine::get().recorder(), options),
        comm_(std::move(comm)) {}

  std::string_view backend_name() const override { return "mpi"; }
  bool shares_memory() const override { return comm_->shm != nullptr; }

 protected:
  void start(std::shared_ptr<const OpDesc> desc, const WorkPtr& work) override {
    Engine& engine = Engine::get();
    work->set_poller([&engine] { return engine.poll(); });
    std::lock_guard lock(engine.mu());
    if (comm_->aborted)
      throw CommError(fmt::format("{}: the group was aborted after an earlier failure", work->info().describe()));
    MpiOp& op = engine.spare_op();
    op.desc = std::move(desc);
    op.work = work;
    op.group = comm_;
    mpi::plan_stages(*op.desc, size(), rank(), op.stages);
    if (!is_p2p(op.desc->op)) {
      if (comm_->verify || comm_->shm) add_fingerprint(op);
      engine.start_spare(op.ordered_stage_ahead());
      return;
    }
    // p2p is not ordered against collectives: post at once, outside the queue.
    work->mark_started();
    const int rc = op.stages[0].post(op, op.requests);
    if (rc != MPI_SUCCESS)
      throw CommError(fmt::format("{} could not start in MPI: {}", work->info().describe(), mpi::error_text(rc)));
    op.pending = 1;
    op.next_stage = 1;
    op.in_flight = true;
    engine.start_spare(/*queue=*/false);
  }

  // The fingerprint travels with the op's first stage, a pairwise one (an
  // empty one first where the op has none).
  void add_fingerprint(MpiOp& op) const {
    if (!op.stages[0].pairwise()) {
      Stage empty;
      empty.pieces = [](MpiOp&, Pieces&) {};
      op.stages.insert(op.stages.begin(), std::move(empty));
    }
    op.first_stage.start(op);
    op.first = &op.first_stage;
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
        rc = MPI_Comm_split(comm_->exchange, color < 0 ? MPI_UNDEFINED : color, key, &child->exchange);
      if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split(comm_->first_exchange, color < 0 ? MPI_UNDEFINED : color, key, &child->first_exchange);
      if (rc != MPI_SUCCESS)
        throw CommError(fmt::format("splitting group '{}' (split seq {}) failed in MPI: {}", this->name(), split_seq,
                                    mpi::error_text(rc)));
      if (color >= 0) {
        MPI_Comm_set_errhandler(child->comm, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(child->exchange, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(child->first_exchange, MPI_ERRORS_RETURN);
        child->shm =
            mpi::ShmRing::open(child->comm, key, static_cast<int>(members.size()), mpi::FirstStage::kMaxInlineRanks);
      }
    }
    if (color < 0) return nullptr;
    child->rank = key;
    child->size = static_cast<int>(members.size());
    child->verify = comm_->verify;
    child->tag_ub = comm_->tag_ub;
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
    MPI_Comm_dup(MPI_COMM_WORLD, &comm->exchange);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm->first_exchange);
    MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(comm->exchange, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(comm->first_exchange, MPI_ERRORS_RETURN);
    comm->shm =
        mpi::ShmRing::open(comm->comm, engine.world_rank(), engine.world_size(), mpi::FirstStage::kMaxInlineRanks);
  }
  comm->rank = engine.world_rank();
  comm->size = engine.world_size();
  comm->verify = options.verify;
  comm->tag_ub = engine.tag_ub();
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
