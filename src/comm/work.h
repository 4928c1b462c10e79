// Handle to an asynchronous communication operation (the c10d Work shape):
// test for completion, wait with the operation's timeout, read its error.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "comm/flight_recorder.h"
#include "comm/types.h"

namespace meshtrain::comm {

using Clock = std::chrono::steady_clock;

// When this process was last continued after a stop (SIGSTOP, a debugger,
// job control); Clock's epoch when never. A stopped process stops every
// clock it cares about, so the time it was stopped does not count against
// its peers: an operation's timeout runs from the later of its issue and
// this. The SIGCONT handler that records it is installed with the first
// Work, unless the program has a SIGCONT handler of its own.
Clock::time_point last_continued() noexcept;

// A thread that watches a deadline in a loop (a waiter, the progress thread)
// calls this with the time it last read the clock and now: a gap longer than
// kPauseGap means the process did not run (it was stopped, and the SIGCONT
// handler has not run yet: it may be scheduled after the thread that would
// declare the timeout), so it counts as continued now. Returns now.
inline constexpr std::chrono::milliseconds kPauseGap{1000};
Clock::time_point note_pause(Clock::time_point last_seen, Clock::time_point now) noexcept;

// What an operation is, for error messages and the flight recorder.
struct WorkInfo {
  std::string group;
  int group_size = 0;
  int rank = 0;  // this rank, in the group
  uint64_t seq = 0;
  bool p2p = false;
  OpType op = OpType::barrier;
  std::chrono::milliseconds timeout{0};
  std::string describe() const;  // "all_reduce (seq 5) on group 'world' (4 ranks)"
};

class Work {
 public:
  Work(WorkInfo info, std::shared_ptr<FlightRecorder> recorder, uint64_t recorder_id,
       Clock::time_point issued_at = Clock::now());
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  const WorkInfo& info() const { return info_; }
  // Non-blocking: has the operation finished (successfully or not)?
  bool is_completed();
  bool is_success();
  std::exception_ptr exception();
  // Block until done, or until the operation's timeout (counted from when it
  // was issued, or this process was last continued) expires; rethrows the
  // failure (TimeoutError, CommError).
  void wait();
  // Block at most `d`: true when done (rethrows a failure), false when still running.
  bool wait_for(std::chrono::milliseconds d);
  Clock::time_point issued_at() const { return issued_at_; }
  Clock::time_point deadline() const { return std::max(issued_at_, last_continued()) + info_.timeout; }

  // ---- backend side -------------------------------------------------------
  // A poller drives progress from the waiting thread (MPI) and returns
  // whether anything advanced: the waiter gives up its core only when nothing
  // did. Without one the backend pushes completion through finish()/fail().
  void set_poller(std::function<bool()> poll) { poller_ = std::move(poll); }
  // Called (at most once) when the deadline passes before completion. One
  // handler serves every Work of a group (shared, so issuing allocates none).
  using TimeoutHandler = std::function<void(Work&)>;
  void set_timeout_handler(std::shared_ptr<const TimeoutHandler> handler) { on_timeout_ = std::move(handler); }
  void set_timeout_handler(TimeoutHandler handler) {
    on_timeout_ = std::make_shared<const TimeoutHandler>(std::move(handler));
  }
  void mark_started();
  void finish();
  void fail(std::exception_ptr error);  // no effect when already done

 private:
  bool wait_until(Clock::time_point until);  // true when done
  void check_deadline();

  WorkInfo info_;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t recorder_id_;
  Clock::time_point issued_at_;
  std::function<bool()> poller_;
  std::shared_ptr<const TimeoutHandler> on_timeout_;
  std::once_flag timeout_once_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};  // set under mu_, after error_; read without it by polling waiters
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace meshtrain::comm
