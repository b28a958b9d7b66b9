#include "parallel/cuda_watch.h"

#include <cuda_runtime.h>

#include "core/comm/watchdog.h"

namespace nsatron::parallel {

void watch_stream_work(const std::string& what, cudaStream_t stream, int device) {
  Watchdog& dog = Watchdog::instance();
  if (!dog.armed()) return;
  cudaEvent_t done = nullptr;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) return;
  if (cudaEventRecord(done, stream) != cudaSuccess) {
    cudaEventDestroy(done);
    return;
  }
  dog.open(
      what,
      [done, device] {
        cudaSetDevice(device);  // the watchdog's thread: the event's device
        return cudaEventQuery(done) != cudaErrorNotReady;  // done, or an error the caller sees
      },
      [done] { cudaEventDestroy(done); });
}

}  // namespace nsatron::parallel
