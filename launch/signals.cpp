#include "launch/signals.h"

#include <csignal>

namespace nsatron {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop(int sig) { g_stop_signal = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = record_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int stop_signal() { return g_stop_signal; }

}  // namespace nsatron
