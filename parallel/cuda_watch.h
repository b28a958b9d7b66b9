// The communication watchdog's view of GPU work (core/comm/watchdog.h): a watch on the work
// enqueued so far on a CUDA stream, closed when an event recorded after it completes. The
// communicators of device tensors open one per operation they enqueue, since their calls
// return before the work is done (a dead peer shows as work that never completes).
#pragma once
#include <string>

struct CUstream_st;

namespace nsatron::parallel {

// While the watchdog is armed: records an event on `stream` (of CUDA device `device`) and
// opens a watch named `what` that closes when the event completes (or reports an error, which
// the caller's next CUDA call sees). Disarmed: nothing.
void watch_stream_work(const std::string& what, CUstream_st* stream, int device);

}  // namespace nsatron::parallel
