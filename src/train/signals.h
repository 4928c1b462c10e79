// How a training process takes signals. Every signal that has a handler in
// it goes to one thread of its own, never to a thread that may be running a
// kernel: oneDNN's JIT GEMM points the stack pointer into the heap, so a
// signal frame pushed there corrupts the heap (oneDNN issue 4845; fixed in
// 3.12, Debian ships 2.7). Preemption (SIGTERM, SIGINT, SIGUSR1) stops a
// run at the end of its step.
#pragma once

#include <cstdio>
#include <string>

namespace meshtrain::train {

// Blocks the stop signals (SIGTERM, SIGINT, SIGUSR1) and the signals with
// handlers (SIGCONT: comm's watch for a stopped process; SIGURG: the wake of
// a blocked progress write) in this thread, so in every thread it starts
// after, and starts the thread they go to. Until stop_at_step_end_on_signals
// a stop signal ends the process as it would have. SIGXFSZ is ignored: a
// write past `ulimit -f` fails with an error that names the file. Call it
// first, before MPI or any kernel starts a thread.
void hand_signals_to_a_thread();

// From now on SIGTERM, SIGINT and SIGUSR1 (preemption, Ctrl-C) ask a running
// Trainer::run to stop at the end of its step: the ranks agree on it, save a
// checkpoint when checkpoint.folder is set, and run() returns saying so.
// `under_launcher`: stdout and stderr go through a launcher (mpirun) that
// stops reading them once it is signalled itself; the signal makes them
// non-blocking, so a rank drops lines rather than stall before its save.
void stop_at_step_end_on_signals(bool under_launcher);

// The stop signal this process got since stop_at_step_end_on_signals (the
// last one), or 0.
int stop_signal_received();

// Writes a progress line, best effort: one that cannot be written (a
// launcher that stopped reading after a signal) is dropped, never an error
// or a stall. Only while it writes can the thread be woken by a signal.
void write_progress(std::FILE* out, const std::string& text);

// "SIGTERM", "SIGINT", "SIGUSR1", or the system's name of another signal.
std::string signal_name(int signal);

}  // namespace meshtrain::train
