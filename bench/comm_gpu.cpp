// Communication bandwidth between the GPUs of one host, through NCCL, at the message sizes of
// the 125M model's parallel layouts (configs/nsa_125m.toml, micro-batch 16 x 2048):
//   - all-reduce (sum) of a [16 x 2048, 768] bf16 activation (48 MiB): tensor parallelism runs
//     four per layer and micro-batch; and of its half (parallel.tp_overlap's row parts);
//   - all-gather into and reduce-scatter out of the same activation (each rank's block of
//     rows): what sequence parallelism would run in place of each all-reduce;
//   - all-reduce of a 25 MiB fp32 gradient bucket (parallel.grad_bucket_kib's default):
//     data parallelism;
//   - send / receive of the same activation between GPU 0 and GPU 1: a pipeline message.
// One process drives every visible GPU (ncclCommInitAll). Per size: time per call (CUDA
// events on GPU 0 over --reps calls after 2 warm-up calls), the algorithm bandwidth (bytes /
// time; for the all-gather and the reduce-scatter, the whole activation's bytes) and NCCL's bus
// bandwidth (what each link carries: the algorithm bandwidth x 2 (n - 1) / n for the all-reduce,
// x (n - 1) / n for the all-gather and the reduce-scatter), and whether the pairs of GPUs reach
// each other by peer access.
//
//   build/bench/comm_gpu [--reps N]
//
// Results: docs/performance.md ("GPU ranks").
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, ncclGetErrorString(r));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: comm_gpu [--reps N]\n");
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;  // no driver: no GPU
  if (n < 2) {
    std::printf("comm_gpu: %d GPU visible; the bandwidth between GPUs needs at least 2\n", n);
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("%d x %s\n", n, prop.name);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      int ok = 0;
      check(cudaDeviceCanAccessPeer(&ok, a, b), "cudaDeviceCanAccessPeer");
      std::printf("GPU %d <-> GPU %d: peer access %s\n", a, b, ok ? "yes" : "no");
    }
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n), nullptr);
  std::vector<int> devs(static_cast<std::size_t>(n));
  for (int d = 0; d < n; ++d) devs[std::size_t(d)] = d;
  check(ncclCommInitAll(comms.data(), n, devs.data()), "ncclCommInitAll");
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(n));
  for (int d = 0; d < n; ++d) {
    check(cudaSetDevice(d), "cudaSetDevice");
    check(cudaStreamCreate(&streams[std::size_t(d)]), "cudaStreamCreate");
  }

  enum class Op { AllReduce, AllGather, ReduceScatter, SendRecv };
  struct Case {
    const char* name;
    std::size_t count;  // elements of the whole message (all-gather: its output; reduce-scatter: its input)
    ncclDataType_t type;
    std::size_t elem;
    Op op;
  };
  const std::size_t act = std::size_t(16) * 2048 * 768;
  const std::vector<Case> cases = {
      {"all-reduce, [16 x 2048, 768] bf16 (tp)", act, ncclBfloat16, 2, Op::AllReduce},
      {"all-reduce, [8 x 2048, 768] bf16 (tp_overlap's half)", act / 2, ncclBfloat16, 2, Op::AllReduce},
      {"all-gather, [16 x 2048, 768] bf16 (sp)", act, ncclBfloat16, 2, Op::AllGather},
      {"reduce-scatter, [16 x 2048, 768] bf16 (sp)", act, ncclBfloat16, 2, Op::ReduceScatter},
      {"all-reduce, 25 MiB fp32 bucket (dp)", std::size_t(25) << 18, ncclFloat32, 4, Op::AllReduce},
      {"send/recv GPU 0 -> 1, [16 x 2048, 768] bf16 (pp)", act, ncclBfloat16, 2, Op::SendRecv},
  };
  std::printf("%-52s %10s %10s %12s %12s\n", "operation", "MiB", "ms/call", "alg GB/s", "bus GB/s");
  for (const Case& c : cases) {
    const std::size_t bytes = c.count * c.elem;
    std::vector<void*> buf(static_cast<std::size_t>(n), nullptr);
    for (int d = 0; d < n; ++d) {
      check(cudaSetDevice(d), "cudaSetDevice");
      check(cudaMalloc(&buf[std::size_t(d)], bytes), "cudaMalloc");
      check(cudaMemset(buf[std::size_t(d)], 0, bytes), "cudaMemset");
    }
    const std::size_t block = c.count / std::size_t(n);  // a rank's rows (all-gather, reduce-scatter)
    auto once = [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      if (c.op == Op::SendRecv) {
        check(ncclSend(buf[0], c.count, c.type, 1, comms[0], streams[0]), "ncclSend");
        check(ncclRecv(buf[1], c.count, c.type, 0, comms[1], streams[1]), "ncclRecv");
      }
      for (int d = 0; c.op != Op::SendRecv && d < n; ++d) {
        const std::size_t i = std::size_t(d);
        char* b = static_cast<char*>(buf[i]);
        char* own = b + std::size_t(d) * block * c.elem;  // in place: the rank's block of the whole
        if (c.op == Op::AllReduce)
          check(ncclAllReduce(b, b, c.count, c.type, ncclSum, comms[i], streams[i]), "ncclAllReduce");
        else if (c.op == Op::AllGather)
          check(ncclAllGather(own, b, block, c.type, comms[i], streams[i]), "ncclAllGather");
        else
          check(ncclReduceScatter(b, own, block, c.type, ncclSum, comms[i], streams[i]), "ncclReduceScatter");
      }
      check(ncclGroupEnd(), "ncclGroupEnd");
    };
    auto sync_all = [&] {
      for (int d = 0; d < n; ++d) {
        check(cudaSetDevice(d), "cudaSetDevice");
        check(cudaStreamSynchronize(streams[std::size_t(d)]), "cudaStreamSynchronize");
      }
    };
    once();
    once();
    sync_all();
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaEvent_t t0, t1;
    check(cudaEventCreate(&t0), "cudaEventCreate");
    check(cudaEventCreate(&t1), "cudaEventCreate");
    check(cudaEventRecord(t0, streams[0]), "cudaEventRecord");
    for (int r = 0; r < reps; ++r) once();
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaEventRecord(t1, streams[0]), "cudaEventRecord");
    sync_all();
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
    const double per = double(ms) / reps, alg = double(bytes) / (per * 1e-3) / 1e9;
    const double bus = c.op == Op::SendRecv    ? alg
                       : c.op == Op::AllReduce ? alg * 2.0 * (n - 1) / n
                                               : alg * double(n - 1) / n;
    std::printf("%-52s %10.1f %10.3f %12.1f %12.1f\n", c.name, double(bytes) / (1 << 20), per, alg, bus);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    for (int d = 0; d < n; ++d) {
      check(cudaSetDevice(d), "cudaSetDevice");
      check(cudaFree(buf[std::size_t(d)]), "cudaFree");
    }
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  return 0;
}
