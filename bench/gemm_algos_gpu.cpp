// The model's matrix products against every algorithm cuBLASLt offers for them: for each
// product of a layer (forward, dX, dW as core/ops/cuda/linear.cu calls them) at one GPU's
// shapes and at a tensor-parallel rank's (heads, groups and hidden width divided by tp), the
// time of the heuristic's first choice (the one the engine runs), of the fastest of the
// others, and whether that one gives the same bits. The question it answers: is there a
// faster algorithm for the half-width products of a tp rank (docs/performance.md,
// 2026-11-30), and would choosing it change the results.
//
//   build-gpu/bench/bench_gemm_algos_gpu [CONFIG] [--micro N] [--tp 1,2] [--reps N] [--algos N]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/device/cuda_check.h"
#include "core/device/device.h"
#include "core/model/model.h"
#include "core/model/rng.h"

using namespace nsatron;

namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + " failed: " + std::to_string(int(s)));
}

constexpr std::size_t kWorkspace = 32u << 20;  // as core/ops/cuda/matmul.cu

// A row-major product C[M, N] = op(A) op(B) (+ C when accumulate), bf16 operands, C bf16 or
// fp32, passed to cuBLASLt swapped as core/ops/cuda/matmul.cu does.
struct Problem {
  std::string name;
  bool ta, tb;
  std::int64_t M, N, K, ldc;
  bool c_fp32;  // the weight gradients: fp32, accumulated (beta 1)
};

struct Lt {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
};

float time_algo(const Lt& lt, const cublasLtMatmulAlgo_t& algo, const void* A, const void* B, void* C, float beta,
                void* ws, int reps) {
  const float alpha = 1.0f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto run = [&] {
    return cublasLtMatmul(lt.h, lt.op, &alpha, B, lt.a, A, lt.b, &beta, C, lt.c, C, lt.c, &algo, ws, kWorkspace, 0);
  };
  if (run() != CUBLAS_STATUS_SUCCESS) return -1.0f;
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) run();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / float(reps);
}

std::string algo_text(const cublasLtMatmulAlgo_t& algo) {
  auto attr = [&](cublasLtMatmulAlgoConfigAttributes_t a) {
    std::uint32_t v = 0;  // (every attribute printed is 32 bits)
    std::size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v, sizeof v, &written) != CUBLAS_STATUS_SUCCESS) return -1LL;
    return (long long)v;
  };
  char buf[160];
  std::snprintf(buf, sizeof buf, "id %lld tile %lld stages %lld splitK %lld red %lld swz %lld cluster %lld",
                attr(CUBLASLT_ALGO_CONFIG_ID), attr(CUBLASLT_ALGO_CONFIG_TILE_ID), attr(CUBLASLT_ALGO_CONFIG_STAGES_ID),
                attr(CUBLASLT_ALGO_CONFIG_SPLITK_NUM), attr(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                attr(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), attr(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  return buf;
}

// n bf16 values uniform in [-1, 1) at p (device).
void fill(void* p, std::size_t n, std::uint64_t seed) {
  std::vector<bf16> host(n);
  SplitMix64 rng(seed);
  for (bf16& v : host) v = bf16(float(2.0 * rng.uniform() - 1.0));
  CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
}

// Times the heuristic's algorithms for one problem; prints the first and the fastest.
void measure(const Problem& pr, int reps, int max_algos, void* ws, double& first_total, double& best_total,
             double calls) {
  Lt lt;
  check(cublasLtCreate(&lt.h), "create");
  check(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  cublasOperation_t op_first = pr.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = pr.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first), "transa");
  check(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second), "transb");
  const std::int64_t M = pr.M, N = pr.N, K = pr.K;
  const std::int64_t lda = pr.ta ? M : K, ldb = pr.tb ? K : N;
  const cudaDataType_t c_type = pr.c_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  check(cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_16BF, pr.tb ? K : N, pr.tb ? N : K, ldb), "layout B");
  check(cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_16BF, pr.ta ? M : K, pr.ta ? K : M, lda), "layout A");
  check(cublasLtMatrixLayoutCreate(&lt.c, c_type, N, M, pr.ldc), "layout C");
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  std::size_t wsb = kWorkspace;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb), "ws");
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(max_algos));
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(lt.h, lt.op, lt.a, lt.b, lt.c, lt.c, pref, max_algos, results.data(), &found),
        "heuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) {
    std::printf("  %-16s no algorithm\n", pr.name.c_str());
    return;  // (the descriptors leak: a benchmark's exit frees them)
  }

  const std::size_t a_elems = std::size_t(pr.ta ? K * M : M * K), b_elems = std::size_t(pr.tb ? N * K : K * N);
  const std::size_t c_bytes = std::size_t(M * pr.ldc) * (pr.c_fp32 ? 4 : 2);
  void *A, *B, *C, *C0;
  CUDA_CHECK(cudaMalloc(&A, a_elems * 2));
  CUDA_CHECK(cudaMalloc(&B, b_elems * 2));
  CUDA_CHECK(cudaMalloc(&C, c_bytes));
  CUDA_CHECK(cudaMalloc(&C0, c_bytes));
  fill(A, a_elems, 1);
  fill(B, b_elems, 2);
  const float beta = pr.c_fp32 ? 1.0f : 0.0f;
  // The reference bits: one call of the first algorithm on a zeroed C.
  auto one_call = [&](const cublasLtMatmulAlgo_t& algo, void* out) {
    CUDA_CHECK(cudaMemset(out, 0, c_bytes));
    const float alpha = 1.0f;
    const cublasStatus_t s =
        cublasLtMatmul(lt.h, lt.op, &alpha, B, lt.a, A, lt.b, &beta, out, lt.c, out, lt.c, &algo, ws, kWorkspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    return s == CUBLAS_STATUS_SUCCESS;
  };
  std::vector<unsigned char> ref(c_bytes), got(c_bytes);
  one_call(results[0].algo, C0);
  CUDA_CHECK(cudaMemcpy(ref.data(), C0, c_bytes, cudaMemcpyDeviceToHost));

  const double flop = 2.0 * double(M) * double(N) * double(K);
  const float first = time_algo(lt, results[0].algo, A, B, C, beta, ws, reps);
  if (first <= 0) throw std::runtime_error(pr.name + ": the heuristic's first algorithm failed to run");
  int best = 0;
  float best_ms = first;
  for (int i = 1; i < found; ++i) {
    const float ms = time_algo(lt, results[i].algo, A, B, C, beta, ws, reps);
    if (ms > 0 && ms < best_ms) best_ms = ms, best = i;
  }
  bool same = true;
  if (best != 0) {
    one_call(results[best].algo, C);
    CUDA_CHECK(cudaMemcpy(got.data(), C, c_bytes, cudaMemcpyDeviceToHost));
    same = std::memcmp(ref.data(), got.data(), c_bytes) == 0;
  }
  std::printf("  %-16s M %6lld N %5lld K %6lld  %2d algos  first %.4f ms (%4.0f TF/s)  best #%-2d %.4f ms (%4.0f TF/s) %s"
              "  %+5.1f%%\n      first: %s\n      best:  %s\n",
              pr.name.c_str(), (long long)M, (long long)N, (long long)K, found, first, flop / first / 1e9, best, best_ms,
              flop / best_ms / 1e9, best == 0 ? "(the first)" : same ? "same bits" : "OTHER BITS",
              100.0 * (best_ms - first) / first, algo_text(results[0].algo).c_str(),
              algo_text(results[best].algo).c_str());
  first_total += calls * first;
  best_total += calls * (best_ms);
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  cudaFree(C0);
  cublasLtMatrixLayoutDestroy(lt.a);
  cublasLtMatrixLayoutDestroy(lt.b);
  cublasLtMatrixLayoutDestroy(lt.c);
  cublasLtMatmulDescDestroy(lt.op);
  cublasLtDestroy(lt.h);
}

}  // namespace

int run(int argc, char** argv) {
  std::string path = "configs/nsa_125m.toml";
  std::int64_t micro = 16;
  int reps = 20, max_algos = 16;
  std::vector<int> tps{1, 2};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--micro" && i + 1 < argc) micro = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--algos" && i + 1 < argc) max_algos = std::atoi(argv[++i]);
    else if (a == "--tp" && i + 1 < argc) {
      tps.clear();
      for (std::string s = argv[++i]; !s.empty();) {
        const auto comma = s.find(',');
        tps.push_back(std::atoi(s.substr(0, comma).c_str()));
        s = comma == std::string::npos ? "" : s.substr(comma + 1);
      }
    } else path = a;
  }
  if (!cuda_available()) {
    std::printf("no CUDA device: %s\n", cuda_device_summary().c_str());
    return 0;
  }
  const RunConfig cfg = load_config(path, {});
  const ModelDims whole = ModelDims::from_config(cfg);
  const std::int64_t rows = micro * cfg.train.seq_len;
  void* ws = nullptr;
  CUDA_CHECK(cudaMalloc(&ws, kWorkspace));
  for (const int tp : tps) {
    ModelDims d = whole;  // a rank's shapes, as NsaTransformer::shard_geometry
    d.H /= tp;
    d.G /= tp;
    d.F /= tp;
    const std::int64_t C = d.C, proj = d.G * d.group_width(), pitch = d.projection_pitch();
    std::printf("tp %d: %lld rows, C %lld, heads %lld, projection %lld (pitch %lld), hidden %lld\n", tp,
                (long long)rows, (long long)C, (long long)d.H, (long long)proj, (long long)pitch, (long long)d.F);
    // linear_forward: y[rows, out] = x[rows, in] w[out, in]^T; dX: dx = dy w; dW: dw += dy^T x.
    struct Product {
      const char* name;
      std::int64_t in, out, ldy;
    };
    const Product products[] = {{"wqkv (padded)", C, pitch, pitch},  // projection_products_padded
                                {"wo", d.H * d.D, C, C},
                                {"w_gate|w_up", C, 2 * d.F, 2 * d.F},
                                {"w_out", d.F, C, C}};
    double first_total = 0, best_total = 0;
    // The LM head: its vocabulary rows split over the TP ranks, the rows in chunks of
    // NsaTransformer::kDefaultHeadChunk (each chunk's dW adds into the fp32 gradient).
    const std::int64_t chunk = std::min(rows, NsaTransformer::kDefaultHeadChunk), Vl = (d.V + tp - 1) / tp;
    const double chunks = double((rows + chunk - 1) / chunk);
    // A product's forward, dX and dW over `n` rows, `count` times per micro-batch.
    auto passes = [&](const Product& p, std::int64_t n, double count) {
      const std::string name(p.name);
      measure({name + " fwd", false, true, n, p.out, p.in, p.ldy, false}, reps, max_algos, ws, first_total,
              best_total, count);
      measure({name + " dX", false, false, n, p.in, p.out, p.in, false}, reps, max_algos, ws, first_total,
              best_total, count);
      measure({name + " dW", true, false, p.out, p.in, n, p.in, true}, reps, max_algos, ws, first_total, best_total,
              count);
    };
    passes({"lm head", C, Vl, Vl}, chunk, chunks);
    for (const Product& p : products) passes(p, rows, double(d.L));
    std::printf(" tp %d, per micro-batch (%lld layers and the head): the first algorithms %.2f ms, the fastest %.2f ms (%+.1f%%)\n\n",
                tp, (long long)d.L, first_total, best_total, 100.0 * (best_total - first_total) / first_total);
  }
  cudaFree(ws);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_algos_gpu: %s\n", e.what());
    return 1;
  }
}
