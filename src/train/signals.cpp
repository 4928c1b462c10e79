#include "train/signals.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/process_group.h"

namespace meshtrain::train {

namespace {
std::atomic<int> stop_signal{0};  // read at the end of each step
std::atomic<bool> stop_at_step_end{false};
std::atomic<bool> unblock_output_on_stop{false};

// While true the progress writer may be blocked writing to a launcher that
// stopped reading: a stop signal wakes it with kWakeSignal, which only that
// thread, only while it writes, does not block.
std::atomic<bool> writing_progress{false};
pthread_t progress_writer{};
constexpr int kWakeSignal = SIGURG;  // ignored by default; its handler does nothing
extern "C" void on_wake_signal(int) {}

sigset_t signals_of(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (const int signal : signals) sigaddset(&set, signal);
  return set;
}
sigset_t stop_signals() { return signals_of({SIGTERM, SIGINT, SIGUSR1}); }

// Done on the signal thread, an ordinary thread: no async-signal-safety needed.
void on_stop_signal(int signal) {
  stop_signal.store(signal);
  // A collective still waiting a moment later is named (mpirun sends
  // SIGTERM when a rank dies, then SIGKILL).
  if (signal != SIGUSR1) comm::note_stop_signal(signal);
  // mpirun stops reading its ranks' output when it is sent SIGTERM or SIGINT
  // itself (it forwards SIGUSR1 and goes on reading).
  if (!unblock_output_on_stop.load() || signal == SIGUSR1) return;
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    const int flags = fcntl(fd, F_GETFL);
    if (flags != -1) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  }
  // A write already blocked stays so until a signal interrupts it.
  if (writing_progress.load()) pthread_kill(progress_writer, kWakeSignal);
}

// The signal thread: takes SIGCONT's handler (unblocked here alone) and waits for the stop signals.
void wait_for_signals(sigset_t stop) {
  const sigset_t cont = signals_of({SIGCONT});
  pthread_sigmask(SIG_UNBLOCK, &cont, nullptr);
  for (;;) {
    int signal = 0;
    if (sigwait(&stop, &signal) != 0) continue;
    if (stop_at_step_end.load()) {
      on_stop_signal(signal);
      continue;
    }
    std::signal(signal, SIG_DFL);  // not training yet: what the signal would have done
    const sigset_t one = signals_of({signal});
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(signal);
  }
}
}  // namespace

void hand_signals_to_a_thread() {
  static std::once_flag started;
  std::call_once(started, [] {
    std::signal(SIGXFSZ, SIG_IGN);
    const sigset_t blocked = signals_of({SIGTERM, SIGINT, SIGUSR1, SIGCONT, kWakeSignal});
    pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
    std::thread(wait_for_signals, stop_signals()).detach();
  });
}

void stop_at_step_end_on_signals(bool under_launcher) {
  unblock_output_on_stop.store(under_launcher);
  progress_writer = pthread_self();
  struct sigaction wake {};
  wake.sa_handler = on_wake_signal;
  sigemptyset(&wake.sa_mask);
  wake.sa_flags = 0;  // no SA_RESTART: the blocked write returns
  sigaction(kWakeSignal, &wake, nullptr);
  hand_signals_to_a_thread();  // a no-op where the command did it first, as it should
  stop_at_step_end.store(true);
}

int stop_signal_received() { return stop_signal.load(); }

void write_progress(std::FILE* out, const std::string& text) {
  if (out == nullptr) return;
  const sigset_t wake = signals_of({kWakeSignal});
  const bool wakeable = pthread_equal(pthread_self(), progress_writer) != 0;
  if (wakeable) {
    writing_progress.store(true);
    pthread_sigmask(SIG_UNBLOCK, &wake, nullptr);
  }
  std::fwrite(text.data(), 1, text.size(), out);
  std::fflush(out);
  if (wakeable) {
    pthread_sigmask(SIG_BLOCK, &wake, nullptr);
    writing_progress.store(false);
  }
  std::clearerr(out);
}

std::string signal_name(int signal) {
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGUSR1) return "SIGUSR1";
  return strsignal(signal);
}

}  // namespace meshtrain::train
