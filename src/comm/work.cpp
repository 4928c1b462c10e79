#include "comm/work.h"

#include <thread>

#include "core/error.h"

namespace meshtrain::comm {

std::string WorkInfo::describe() const {
  return fmt::format("{} ({}seq {}) on group '{}' ({} ranks)", op_type_name(op), p2p ? "p2p " : "",
                     seq, group, group_size);
}

Work::Work(WorkInfo info, std::shared_ptr<FlightRecorder> recorder, uint64_t recorder_id)
    : info_(std::move(info)),
      recorder_(std::move(recorder)),
      recorder_id_(recorder_id),
      deadline_(Clock::now() + info_.timeout) {}

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
  if (Clock::now() < deadline_) return;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
  }
  std::call_once(timeout_once_, [&] {
    if (on_timeout_) on_timeout_(*this);
  });
}

bool Work::wait_until(Clock::time_point until) {
  for (;;) {
    if (poller_) poller_();
    std::unique_lock lock(mu_);
    if (done_) return true;
    if (Clock::now() >= until) return false;
    if (poller_) {
      lock.unlock();
      std::this_thread::yield();
    } else {
      cv_.wait_until(lock, until, [&] { return done_; });
    }
  }
}

void Work::wait() {
  if (!wait_until(deadline_)) {
    check_deadline();
    wait_until(Clock::now() + std::chrono::seconds(5));  // the timeout handler fails the work
  }
  std::lock_guard lock(mu_);
  if (!done_)
    throw TimeoutError(fmt::format("{} timed out after {} ms and the backend did not cancel it",
                                   info_.describe(), info_.timeout.count()));
  if (error_) std::rethrow_exception(error_);
}

bool Work::wait_for(std::chrono::milliseconds d) {
  const auto until = Clock::now() + d;
  if (until >= deadline_) {
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
    if (done_) return;
    done_ = true;
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
    if (done_) return;
    done_ = true;
    error_ = error;
  }
  if (recorder_) recorder_->update(recorder_id_, FrState::failed, message);
  cv_.notify_all();
}

}  // namespace meshtrain::comm
