// Graceful stop on SIGTERM / SIGUSR1 (what schedulers send before preempting a job): the
// handler only records the signal; the training loop finishes its current step, saves a
// checkpoint and exits with kExitStoppedBySignal. A second signal during the save changes
// nothing (the save is atomic and the handler only sets a flag again).
#pragma once

namespace nsatron {

// Exit code of a run stopped by SIGTERM/SIGUSR1 after saving its checkpoint: the job should
// be requeued and will resume from that checkpoint. Distinct from 0 (done), 1 (failed), 2
// (bad input).
inline constexpr int kExitStoppedBySignal = 3;

void install_stop_handlers();
// The signal number received, or 0.
int stop_signal();

}  // namespace nsatron
