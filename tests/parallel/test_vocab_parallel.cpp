// Vocab-parallel cross entropy under mpirun: the world is the tensor-parallel group, each rank
// holds a slice of the vocabulary (uneven when the size does not divide), and the loss and
// every rank's slice of the gradient equal cross_entropy_fused on the whole logits.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/model/rng.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/vocab_parallel_cross_entropy.h"
#include "parallel/mpi_communicator.h"

using namespace nsatron;

namespace {

void check(DType dtype, double tol) {
  auto world = parallel::MpiCommunicator::world();
  const int P = world->size(), r = world->rank();
  const std::int64_t N = 9, V = 37;
  SplitMix64 rng(12345);  // the same logits and targets on every rank
  std::vector<double> full(std::size_t(N * V));
  for (auto& x : full) x = 3.0 * rng.normal();
  std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
  for (auto& t : targets) t = std::int32_t(rng.next() % std::uint64_t(V));
  targets[4] = -100;  // one ignored row

  // Reference: the whole logits on one rank.
  Tensor ref = Tensor::from_vector(full, {N, V}, dtype), loss = Tensor::zeros({1}, dtype);
  cross_entropy_fused(ref, targets, loss, 2.0);
  const double ref_loss = loss.to_vector()[0];
  const std::vector<double> ref_grad = ref.to_vector();

  // This rank's columns: ceil(V / P) each, the last rank fewer.
  const std::int64_t per = (V + P - 1) / P, start = std::min<std::int64_t>(V, r * per),
                     end = std::min<std::int64_t>(V, start + per), Vr = end - start;
  std::vector<double> mine(std::size_t(N * Vr));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t v = 0; v < Vr; ++v) mine[std::size_t(n * Vr + v)] = full[std::size_t(n * V + start + v)];
  Tensor local = Tensor::from_vector(mine, {N, Vr}, dtype);
  parallel::VocabParallelCE opt;
  opt.vocab_start = start;
  const double got = parallel::vocab_parallel_cross_entropy(*world, local, targets, 2.0, opt);
  EXPECT_NEAR(got, ref_loss, tol * std::abs(ref_loss));
  const std::vector<double> g = local.to_vector();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t v = 0; v < Vr; ++v)
      EXPECT_NEAR(g[std::size_t(n * Vr + v)], ref_grad[std::size_t(n * V + start + v)], tol)
          << "row " << n << " column " << start + v << " on rank " << r << " of " << P;
}

}  // namespace

TEST(VocabParallelCE, MatchesTheWholeLogitsFp64) { check(DType::F64, 1e-12); }
TEST(VocabParallelCE, MatchesTheWholeLogitsFp32) { check(DType::F32, 1e-5); }

// The LM head's order: chunk k's exchange started before chunk k-1 is finished (start, start,
// finish, ..., wait_all, finish). Every rank's loss and gradient are the blocking calls' bits.
TEST(VocabParallelCE, ChunksInFlightGiveTheBlockingBits) {
  auto world = parallel::MpiCommunicator::world();
  const int P = world->size(), r = world->rank();
  const std::int64_t V = 41, chunks = 3, rows = 7;
  const std::int64_t per = (V + P - 1) / P, start = std::min<std::int64_t>(V, r * per),
                     Vr = std::min<std::int64_t>(V, start + per) - start;
  SplitMix64 rng(777 + std::uint64_t(r));  // each rank its own columns
  std::vector<double> z(std::size_t(chunks * rows * Vr));
  for (auto& x : z) x = 2.0 * rng.normal();
  SplitMix64 same(99);  // the same targets on every rank
  std::vector<std::int32_t> targets(static_cast<std::size_t>(chunks * rows));
  for (auto& t : targets) t = std::int32_t(same.next() % std::uint64_t(V));
  targets[3] = -100;
  parallel::VocabParallelCE opt;
  opt.vocab_start = start;
  opt.vocab_size = V;
  opt.denominator = double(chunks * rows);
  auto chunk_of = [&](const Tensor& all, std::int64_t k) { return all.slice0(k * rows, (k + 1) * rows); };
  auto targets_of = [&](std::int64_t k) {
    return std::span<const std::int32_t>(targets).subspan(std::size_t(k * rows), std::size_t(rows));
  };

  Tensor blocking = Tensor::from_vector(z, {chunks * rows, Vr}, DType::F64);
  Tensor blocking_loss = Tensor::zeros({1}, DType::F64);
  for (std::int64_t k = 0; k < chunks; ++k) {
    Tensor c = chunk_of(blocking, k);
    parallel::vocab_parallel_cross_entropy(*world, c, targets_of(k), 1.5, opt, blocking_loss);
  }

  Tensor queued = Tensor::from_vector(z, {chunks * rows, Vr}, DType::F64);
  Tensor queued_loss = Tensor::zeros({1}, DType::F64);
  parallel::VocabParallelCEChunk previous;
  for (std::int64_t k = 0; k < chunks; ++k) {
    Tensor c = chunk_of(queued, k);
    parallel::VocabParallelCEChunk next = parallel::vocab_parallel_ce_start(*world, c, targets_of(k), opt);
    if (k > 0) parallel::vocab_parallel_ce_finish(previous, 1.5, queued_loss);
    previous = std::move(next);
  }
  world->wait_all();
  parallel::vocab_parallel_ce_finish(previous, 1.5, queued_loss);

  EXPECT_EQ(queued_loss.to_vector(), blocking_loss.to_vector()) << "rank " << r;
  EXPECT_EQ(queued.to_vector(), blocking.to_vector()) << "rank " << r;
  EXPECT_NE(queued.to_vector(), z) << "the gradient replaced the logits";
}
