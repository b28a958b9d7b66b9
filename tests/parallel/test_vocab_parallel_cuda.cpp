// Vocab-parallel cross entropy on GPUs under mpirun (1 and 2 ranks, one GPU each; labels gpu
// and mpi): the world is the tensor-parallel group, whose device communicator (NCCL, or a
// SingleCommunicator for one rank) all-reduces the fp64 row results. Each rank holds a slice
// of the vocabulary (uneven when the size does not divide); the loss and every rank's slice
// of the gradient equal cross_entropy_fused on the whole logits on the rank's GPU (fp32 to
// 1e-5, bf16 to 1e-2 in the bound of tests/ops_cuda/cuda_test_util.h), the loss is the same
// bits on every rank and from run to run. Bad targets make the loss NaN on every rank and are
// reported by cuda::check_id_errors(); a missing denominator is refused. Every test skips, on
// every rank alike, without CUDA, without NCCL (more than one rank), or without a GPU per
// rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/ops/cross_entropy.h"
#include "core/ops/vocab_parallel_cross_entropy.h"
#include "core/util/error.h"
#include "parallel/gpu_binding.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "tests/ops_cuda/cuda_test_util.h"
#include "tests/parallel/gpu_test_util.h"

using namespace nsatron;
using namespace nsatron::parallel;

class VocabParallelCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!host_) host_ = std::make_unique<ProcessGroups>(make_process_groups(Backend::Mpi, world_size(), 1));
    const std::string why = gpu_skip_reason(*host_->world);
    if (!why.empty()) GTEST_SKIP() << why;
    if (!dev_) dev_ = std::make_unique<ProcessGroups>(make_device_groups(*host_));
  }
  // Destroyed together on every rank, after the suite (NCCL's destroy may wait for the peers).
  static void TearDownTestSuite() {
    dev_.reset();
    host_.reset();
  }
  static int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }
  Communicator& tp() { return *dev_->tp; }
  Communicator& host_tp() { return *host_->tp; }
  // A seed from rank 0, printed there, the same on every rank.
  std::uint64_t shared_seed() {
    const double mine = host_tp().rank() == 0 ? double(std::random_device{}() % (1u << 30)) : 0.0;
    const auto seed = std::uint64_t(all_reduce_value(host_tp(), mine, ReduceOp::Sum));
    if (host_tp().rank() == 0) std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    return seed;
  }
  // True when `value` is the same bits on every rank.
  bool same_everywhere(double value) {
    const std::vector<double> all = all_gather_values(host_tp(), {value});
    for (double v : all)
      if (std::memcmp(&v, &all[0], sizeof v) != 0) return false;
    return true;
  }
  static inline std::unique_ptr<ProcessGroups> host_, dev_;
};

TEST_F(VocabParallelCuda, MatchesTheWholeLogits) {
  const int P = tp().size(), r = tp().rank();
  ASSERT_EQ(tp().backend(), P > 1 ? "nccl" : "single");
  const auto seed = shared_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);  // the same logits and targets on every rank
  const double dloss = 1.7;
  struct Case {
    std::int64_t N, V;
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : {Case{9, 37}, Case{1, 50}, Case{33, 1000}, Case{16, 50304}, Case{7, 50257}}) {
      const std::int64_t N = c.N, V = c.V;
      const std::string tag = test::dt_name(dt) + " N=" + std::to_string(N) + " V=" + std::to_string(V) +
                              " rank " + std::to_string(r) + " of " + std::to_string(P);
      std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
      for (auto& t : targets) t = rng.uniform(0, 1) < 0.2 ? -100 : std::int32_t(rng.integer(0, V - 1));
      targets[0] = std::int32_t(V - 1);
      const double D = double(count_targets(targets, -100));
      test::DeviceIds ids(targets);
      const Tensor z = test::rounded_f32(rng.randn({N, V}, DType::F32, 3.0), dt);

      // Reference: the whole logits on this rank's GPU.
      Tensor whole = test::on_gpu(z, dt);
      Tensor ref_loss = Tensor::zeros({1}, DType::F32, Device::CUDA);
      cross_entropy_fused(whole, ids.span(), ref_loss, dloss, {.denominator = D});
      const double want = ref_loss.to_vector()[0];

      // This rank's columns: ceil(V / P) each, the last rank fewer.
      const std::int64_t per = (V + P - 1) / P, start = std::min<std::int64_t>(V, r * per),
                         end = std::min<std::int64_t>(V, start + per);
      const Tensor mine = test::columns(z, start, end);
      VocabParallelCE opt;
      opt.vocab_start = start;
      opt.denominator = D;
      opt.vocab_size = V;
      Tensor local = test::on_gpu(mine, dt);
      const double got = vocab_parallel_cross_entropy(tp(), local, ids.span(), dloss, opt);
      EXPECT_NEAR(got, want, test::kRtolF32 * std::abs(want)) << "loss " << tag;
      EXPECT_TRUE(same_everywhere(got)) << "loss bits differ between ranks, " << tag;
      const Tensor ref_cols = test::columns(whole.to(Device::CPU).to_dtype(DType::F32), start, end);
      test::expect_close_rms(local, ref_cols, test::rtol_for(dt), "dlogits " + tag);

      // Run to run: the same bits.
      Tensor again = test::on_gpu(mine, dt);
      const double got2 = vocab_parallel_cross_entropy(tp(), again, ids.span(), dloss, opt);
      EXPECT_EQ(std::memcmp(&got, &got2, sizeof got), 0) << "loss bits, " << tag;
      EXPECT_TRUE(test::same_bits_any(local, again)) << "dlogits bits, " << tag;
    }
  cuda::check_id_errors();  // nothing recorded
}

TEST_F(VocabParallelCuda, BadTargetsMakeTheLossNaNOnEveryRank) {
  const int P = tp().size(), r = tp().rank();
  const std::int64_t N = 4, V = 10, per = (V + P - 1) / P, start = r * per, end = std::min(V, start + per);
  VocabParallelCE opt;
  opt.vocab_start = start;
  opt.denominator = 3;
  opt.vocab_size = V;
  for (const std::vector<std::int32_t>& bad : {std::vector<std::int32_t>{1, -100, -7, 3},
                                               std::vector<std::int32_t>{1, -100, 10, 3}}) {
    test::DeviceIds ids(bad);
    Tensor z = Tensor::zeros({N, end - start}, DType::F32, Device::CUDA);
    const double loss = vocab_parallel_cross_entropy(tp(), z, ids.span(), 1.0, opt);
    EXPECT_TRUE(std::isnan(loss)) << "target " << bad[2] << " on rank " << r;
    const auto g = z.to_vector();
    EXPECT_TRUE(std::isnan(g[std::size_t(2 * (end - start))])) << "target " << bad[2];  // row 2
    EXPECT_EQ(g[std::size_t(end - start)], 0.0);                                    // row 1: ignored
    try {
      cuda::check_id_errors();
      ADD_FAILURE() << "no error reported for target " << bad[2] << " on rank " << r;
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("target " + std::to_string(bad[2]) + " at position 2"), std::string::npos) << msg;
    }
  }
}

TEST_F(VocabParallelCuda, RefusesAMissingDenominatorBeforeAnyCollective) {
  test::DeviceIds ids(std::vector<std::int32_t>{0, 1});
  Tensor z = Tensor::zeros({2, 3}, DType::BF16, Device::CUDA);
  VocabParallelCE opt;
  opt.vocab_start = 3 * tp().rank();
  EXPECT_THROW(vocab_parallel_cross_entropy(tp(), z, ids.span(), 1.0, opt), std::invalid_argument);
  // CPU logits through a device communicator: refused (NCCL takes device tensors only).
  if (tp().size() > 1) {
    Tensor cpu = Tensor::zeros({2, 3}, DType::F32);
    const std::vector<std::int32_t> host_ids = {0, 1};
    opt.denominator = 2;
    EXPECT_THROW(vocab_parallel_cross_entropy(tp(), cpu, host_ids, 1.0, opt), std::invalid_argument);
  }
  // Every rank is still in step: a collective after the refusals completes.
  Tensor one = Tensor::from_vector({1.0}, {1}, DType::F32).to(Device::CUDA);
  tp().all_reduce(one);
  EXPECT_EQ(one.to_vector()[0], double(tp().size()));
}

// The LM head's order over NCCL: chunk k's exchange started (on the communicator's stream)
// before chunk k-1 is finished. The loss and every rank's gradient are the blocking calls' bits.
TEST_F(VocabParallelCuda, ChunksInFlightGiveTheBlockingBits) {
  const int P = tp().size(), r = tp().rank();
  const auto seed = shared_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const std::int64_t V = 50304, chunks = 3, rows = 67;
  const std::int64_t per = (V + P - 1) / P, start = std::min<std::int64_t>(V, r * per),
                     end = std::min<std::int64_t>(V, start + per);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(chunks * rows));
  for (auto& t : targets) t = rng.uniform(0, 1) < 0.1 ? -100 : std::int32_t(rng.integer(0, V - 1));
  test::DeviceIds ids(targets);
  const Tensor z = test::columns(test::rounded_f32(rng.randn({chunks * rows, V}, DType::F32, 3.0), DType::BF16),
                                 start, end);
  VocabParallelCE opt;
  opt.vocab_start = start;
  opt.vocab_size = V;
  opt.denominator = double(chunks * rows);
  auto targets_of = [&](std::int64_t k) { return ids.span().subspan(std::size_t(k * rows), std::size_t(rows)); };

  Tensor blocking = test::on_gpu(z, DType::BF16), blocking_loss = Tensor::zeros({1}, DType::F64, Device::CUDA);
  for (std::int64_t k = 0; k < chunks; ++k) {
    Tensor c = blocking.slice0(k * rows, (k + 1) * rows);
    vocab_parallel_cross_entropy(tp(), c, targets_of(k), 1.3, opt, blocking_loss);
  }
  Tensor queued = test::on_gpu(z, DType::BF16), queued_loss = Tensor::zeros({1}, DType::F64, Device::CUDA);
  VocabParallelCEChunk previous;
  for (std::int64_t k = 0; k < chunks; ++k) {
    Tensor c = queued.slice0(k * rows, (k + 1) * rows);
    VocabParallelCEChunk next = vocab_parallel_ce_start(tp(), c, targets_of(k), opt);
    if (k > 0) vocab_parallel_ce_finish(previous, 1.3, queued_loss);
    previous = std::move(next);
  }
  tp().wait_all();
  vocab_parallel_ce_finish(previous, 1.3, queued_loss);
  EXPECT_TRUE(test::same_bits_any(queued_loss, blocking_loss)) << "loss, rank " << r;
  EXPECT_TRUE(test::same_bits_any(queued, blocking)) << "dlogits, rank " << r;
  EXPECT_TRUE(same_everywhere(queued_loss.to_vector()[0])) << "loss bits differ between ranks";
}
