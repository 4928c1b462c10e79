#include "comm/work.h"

#include <atomic>
#include <csignal>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace meshtrain::comm {

namespace {

// A waiter that drives progress yields its core only after this many polls
// in a row advanced nothing. Open MPI on an oversubscribed host already
// yields inside every idle poll: yielding after each one as well doubled the
// context switches of a small collective (4 ranks on 2 cores).
constexpr int kIdlePollsBeforeYield = 64;
// A polling waiter reads the clock (to notice a stop, see note_pause) once
// per this many polls, and before it yields.
constexpr int kPollsPerClockRead = 32;

std::atomic<Clock::rep> continued_at{0};  // Clock ticks since its epoch
static_assert(std::atomic<Clock::rep>::is_always_lock_free, "set in a signal handler");

extern "C" void on_continued(int) {
  // steady_clock reads CLOCK_MONOTONIC (clock_gettime is async-signal-safe).
  continued_at.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}

void watch_for_continuation() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGCONT, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction action {};
    action.sa_handler = on_continued;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGCONT, &action, nullptr);
  });
}

}  // namespace

Clock::time_point last_continued() noexcept {
  return Clock::time_point(Clock::duration(continued_at.load(std::memory_order_relaxed)));
}

Clock::time_point note_pause(Clock::time_point last_seen, Clock::time_point now) noexcept {
  if (now - last_seen <= kPauseGap) return now;
  const auto ticks = now.time_since_epoch().count();
  for (auto seen = continued_at.load(std::memory_order_relaxed); seen < ticks;)
    if (continued_at.compare_exchange_weak(seen, ticks, std::memory_order_relaxed)) break;
  return now;
}

std::string WorkInfo::describe() const {
  return fmt::format("{} ({}seq {}) on group '{}' ({} ranks)", op_type_name(op), p2p ? "p2p " : "", seq, group,
                     group_size);
}

Work::Work(WorkInfo info, std::shared_ptr<FlightRecorder> recorder, uint64_t recorder_id, Clock::time_point issued_at)
    : info_(std::move(info)), recorder_(std::move(recorder)), recorder_id_(recorder_id), issued_at_(issued_at) {
  watch_for_continuation();
}

bool Work::is_completed() {
  if (poller_) poller_();
  check_deadline();
  std::lock_guard lock(mu_);
  return done_;
}

bool Work::is_success() {
  std::lock_guard lock(mu_);
  return done_ && !error_;
}

std::exception_ptr Work::exception() {
  std::lock_guard lock(mu_);
  return error_;
}

void Work::check_deadline() {
  if (Clock::now() < deadline()) return;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
  }
  std::call_once(timeout_once_, [&] {
    if (on_timeout_ && *on_timeout_) (*on_timeout_)(*this);
  });
}

bool Work::wait_until(Clock::time_point until) {
  if (!poller_) {
    std::unique_lock lock(mu_);
    if (cv_.wait_until(lock, until, [&] { return done_.load(); })) return true;
    note_pause(until, Clock::now());  // woken far past the deadline: the process was stopped
    return false;
  }
  auto seen = Clock::now();
  for (int idle = 0, polls = 1;; ++polls) {
    idle = poller_() ? 0 : idle + 1;
    if (done_.load(std::memory_order_acquire)) return true;
    // A poll takes well under a microsecond: reading the clock at each one
    // cost a small collective a tenth of its time.
    if (polls % kPollsPerClockRead == 0) seen = note_pause(seen, Clock::now());
    if (idle < kIdlePollsBeforeYield) continue;
    seen = note_pause(seen, Clock::now());
    if (seen >= until) return false;
    idle = 0;
    std::this_thread::yield();
  }
}

void Work::wait() {
  while (!wait_until(deadline())) {
    if (Clock::now() < deadline()) continue;  // this process was stopped and continued: the deadline moved
    check_deadline();
    wait_until(Clock::now() + std::chrono::seconds(5));  // the timeout handler fails the work
    break;
  }
  std::lock_guard lock(mu_);
  if (!done_)
    throw TimeoutError(fmt::format("{} timed out after {} ms and the backend did not cancel it", info_.describe(),
                                   info_.timeout.count()));
  if (error_) std::rethrow_exception(error_);
}

bool Work::wait_for(std::chrono::milliseconds d) {
  const auto until = Clock::now() + d;
  if (until >= deadline()) {
    wait();
    return true;
  }
  if (!wait_until(until)) return false;
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
  return true;
}

void Work::mark_started() {
  if (recorder_) recorder_->update(recorder_id_, FrState::started);
}

void Work::finish() {
  {
    std::lock_guard lock(mu_);
    if (done_.load()) return;
    done_.store(true, std::memory_order_release);
  }
  if (recorder_) recorder_->update(recorder_id_, FrState::completed);
  cv_.notify_all();
}

void Work::fail(std::exception_ptr error) {
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown error";
  }
  {
    std::lock_guard lock(mu_);
    if (done_.load()) return;
    error_ = error;
    done_.store(true, std::memory_order_release);
  }
  if (recorder_) recorder_->update(recorder_id_, FrState::failed, message);
  cv_.notify_all();
}

}  // namespace meshtrain::comm
