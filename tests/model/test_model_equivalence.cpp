// Gradient accumulation (one batch of B sequences == micro-batches with grad_scale 1/k, before
// and after an AdamW step) and recompute equivalence (none / selective / full give the same
// bits; the activation peak falls from none to selective to full).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/ops/adamw.h"
#include "nsa/nsa.h"
#include "tests/model/model_test_util.h"

namespace nsatron::test {
namespace {

// ---- gradient accumulation -----------------------------------------------------------------

struct AccumResult {
  double loss = 0;                 // mean of the micro-batch losses
  std::vector<double> grads;       // after the micro-batches
  std::vector<double> weights;     // after one AdamW step on those gradients
};

constexpr AdamWHyper kAccumAdamW{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

// Splits the batch into k micro-batches of B/k sequences, each with grad_scale 1/k, then takes
// one AdamW step.
AccumResult run_accumulated(const ModelDims& dims, DType dtype, const Batch& batch, std::int64_t k) {
  NsaTransformer model(dims, dtype);
  model.params().initialize(5);
  randomize_weights(model, 0.4, 6);
  model.params().zero_grads();
  AccumResult r;
  const std::int64_t per = batch.B / k;
  for (std::int64_t i = 0; i < k; ++i) {
    const Batch mb = sub_batch(batch, i * per, (i + 1) * per);
    r.loss += model.forward_backward(mb.tokens, mb.targets, mb.B, mb.T, 1.0 / double(k)) / double(k);
  }
  r.grads = model.params().flat_grads().to_vector();

  std::vector<ParamSegment> segs;
  for (const auto& p : model.params().infos()) segs.push_back({p.offset, p.numel, p.decay});
  const std::int64_t n = model.params().total();
  Tensor m = Tensor::zeros({n}, dtype), v = Tensor::zeros({n}, dtype);
  adamw_step(model.params().flat_weights(), model.params().flat_grads(), m, v, segs, kAccumAdamW, 1);
  r.weights = model.params().flat_weights().to_vector();
  return r;
}

// The weights after the first AdamW step (m = v = 0) from the same weights w and decay:
//   w' = w (1 - lr wd) - lr f(g),  f(g) = g / (|g| + eps)
// (bias correction makes m_hat = g and sqrt(v_hat) = |g|). Two runs whose gradients differ
// by rounding may therefore differ in a weight by lr |f(g_a) - f(g_b)|, and no more: near
// g = 0 f is steep (slope 1/eps), so a rounding difference of a tiny gradient can move its
// weight by up to 2 lr, by an amount that depends on which BLAS kernel rounded the gradient.
// What accumulation must guarantee is that the optimizer sees the same gradient (checked
// to rtol above) and that the weights differ by nothing that gradient difference does not
// explain: |w_a - w_b| <= lr |f(g_a) - f(g_b)| plus the rounding of the update itself, in
// both runs: about a dozen roundings of a quantity of size lr (m, v, the two bias
// corrections, the square root, + eps, the division, * lr: <= 8 units in the last place of lr
// per run) and two at the weight's scale (the decay product, the subtraction: <= 2 units of
// |w| per run).
double worst_unexplained_weight_gap(const AccumResult& a, const AccumResult& b, double unit) {
  const double lr = kAccumAdamW.lr, eps = kAccumAdamW.eps;
  auto f = [&](double g) { return g / (std::fabs(g) + eps); };
  double worst = 0;
  for (std::size_t i = 0; i < a.weights.size(); ++i) {
    const double explained = lr * std::fabs(f(a.grads[i]) - f(b.grads[i]));
    const double slack = unit * (4 * std::fabs(b.weights[i]) + 16 * lr);
    const double gap = std::fabs(a.weights[i] - b.weights[i]) - explained;
    worst = std::max(worst, gap / slack);
  }
  return worst;  // <= 1: every weight gap explained
}

// rtol bounds the relative difference of the gradients (and the loss): the same sums in
// another grouping (per micro-batch, then added), each rounded in the model's precision; it
// does not depend on the BLAS kernel beyond that rounding.
void check_accumulation(DType dtype, double rtol, Attention attention = Attention::Nsa) {
  ModelDims dims = tiny_dims(false);
  dims.L = 3;
  dims.attention = attention;
  const Batch batch = random_batch(dims.V, 4, 17, 99);
  const AccumResult one = run_accumulated(dims, dtype, batch, 1);
  NsaTransformer shape_only(dims, dtype);
  for (std::int64_t k : {2, 4}) {
    const AccumResult acc = run_accumulated(dims, dtype, batch, k);
    EXPECT_NEAR(acc.loss, one.loss, rtol * std::fabs(one.loss)) << k << " micro-batches: loss";
    double worst_g = 0, worst_w = 0;
    for (const auto& p : shape_only.params().infos()) {
      const double eg = rel_err(acc.grads, one.grads, p.offset, p.numel);
      const double ew = rel_err(acc.weights, one.weights, p.offset, p.numel);
      worst_g = std::max(worst_g, eg);
      worst_w = std::max(worst_w, ew);
      EXPECT_LE(eg, rtol) << k << " micro-batches: gradient of " << p.name;
    }
    const double unit = dtype == DType::F64 ? 0x1p-53 : 0x1p-24;
    EXPECT_LE(worst_unexplained_weight_gap(acc, one, unit), 1.0)
        << k << " micro-batches: a weight after one AdamW step differs by more than the "
        << "gradient difference explains";
    std::printf("  %s, %lld micro-batches: loss %.9g vs %.9g; worst relative error: gradients %.2e, "
                "weights after AdamW %.2e\n",
                std::string(dtype_name(dtype)).c_str(), (long long)k, acc.loss, one.loss, worst_g, worst_w);
  }
  // Something must have moved: the step is not a no-op.
  std::vector<double> w0;
  {
    NsaTransformer model(dims, dtype);
    model.params().initialize(5);
    randomize_weights(model, 0.4, 6);
    w0 = model.params().flat_weights().to_vector();
  }
  EXPECT_GT(rel_err(one.weights, w0, 0, std::int64_t(w0.size())), 1e-3);
}

TEST(ModelAccumulation, Fp32) { check_accumulation(DType::F32, 1e-5); }
TEST(ModelAccumulation, Fp64) { check_accumulation(DType::F64, 1e-12); }
TEST(ModelAccumulation, DenseFp32) { check_accumulation(DType::F32, 1e-5, Attention::Dense); }
TEST(ModelAccumulation, DenseFp64) { check_accumulation(DType::F64, 1e-12, Attention::Dense); }

// ---- recompute ---------------------------------------------------------------------------

struct RunResult {
  double loss = 0;
  Tensor grads;
  std::size_t peak = 0;
};

RunResult run_policy(NsaTransformer& model, const Batch& b, RecomputePolicy policy, std::int64_t layers) {
  model.set_recompute(policy, layers);
  model.params().zero_grads();
  RunResult r;
  r.loss = model.forward_backward(b.tokens, b.targets, b.B, b.T);
  r.grads = model.params().flat_grads().clone();
  r.peak = model.last_activation_peak_bytes();
  return r;
}

// Every element bit for bit (memcmp semantics: -0.0 and 0.0 differ, NaN never passes here).
void expect_same_bits(const RunResult& a, const RunResult& ref, const NsaTransformer& model, const std::string& what) {
  EXPECT_EQ(std::memcmp(&a.loss, &ref.loss, sizeof(double)), 0)
      << what << ": loss " << a.loss << " vs " << ref.loss;
  ASSERT_EQ(a.grads.numel(), ref.grads.numel());
  const float* x = a.grads.data<float>();
  const float* y = ref.grads.data<float>();
  for (const auto& p : model.params().infos()) {
    std::int64_t bad = 0, first = -1;
    for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i)
      if (std::memcmp(x + i, y + i, sizeof(float)) != 0 && bad++ == 0) first = i - p.offset;
    EXPECT_EQ(bad, 0) << what << ": " << p.name << ": " << bad << " of " << p.numel << " elements differ, first ["
                      << first << "] " << x[p.offset + first] << " vs " << y[p.offset + first];
  }
}

void check_recompute_bits(const ModelDims& dims, const Batch& b, std::uint64_t seed, double sd) {
  NsaTransformer model(dims, DType::F32);
  model.params().initialize(seed);
  if (sd > 0) randomize_weights(model, sd, seed + 1);
  const RunResult none = run_policy(model, b, RecomputePolicy::None, 0);
  ASSERT_TRUE(std::isfinite(none.loss));
  // The reference itself must carry information.
  double gmax = 0;
  for (double g : none.grads.to_vector()) gmax = std::max(gmax, std::fabs(g));
  EXPECT_GT(gmax, 0.0);
  // Run twice: the same bits again (no state leaks from one call into the next).
  expect_same_bits(run_policy(model, b, RecomputePolicy::None, 0), none, model, "none, second run");
  expect_same_bits(run_policy(model, b, RecomputePolicy::Selective, 0), none, model, "selective");
  for (std::int64_t layers = 0; layers <= dims.L + 1; ++layers)
    expect_same_bits(run_policy(model, b, RecomputePolicy::Full, layers), none, model,
                     "full, layers=" + std::to_string(layers));
  // And evaluate() agrees with the training forward.
  EXPECT_NEAR(model.evaluate(b.tokens, b.targets, b.B, b.T), none.loss, 1e-5 * std::fabs(none.loss));
}

TEST(ModelRecompute, BitIdenticalTiny) {
  ModelDims d = tiny_dims(false);
  d.L = 3;
  d.sel_count = 4;
  check_recompute_bits(d, random_batch(d.V, 2, 21, 7), 21, 0.4);
}

TEST(ModelRecompute, BitIdenticalTinyTied) {
  ModelDims d = tiny_dims(true, 1);
  check_recompute_bits(d, random_batch(d.V, 3, 13, 8), 22, 0.4);
}

TEST(ModelRecompute, BitIdenticalMid) {
  const ModelDims d = mid_dims();
  check_recompute_bits(d, random_batch(d.V, 2, 128, 9), 23, 0);
}

TEST(ModelRecompute, BitIdenticalDenseTiny) {
  const ModelDims d = dense(tiny_dims(false, 1));
  check_recompute_bits(d, random_batch(d.V, 2, 21, 13), 28, 0.4);
}

TEST(ModelRecompute, BitIdenticalDenseMid) {
  const ModelDims d = dense(mid_dims());
  check_recompute_bits(d, random_batch(d.V, 2, 128, 14), 29, 0);
}

// The same bits whatever the number of OpenMP threads (every op and the NSA core sum in a
// fixed order), under each policy.
TEST(ModelRecompute, BitIdenticalAcrossThreadCounts) {
  ModelDims d = mid_dims();
  d.L = 2;
  const Batch b = random_batch(d.V, 2, 100, 12);
  NsaTransformer model(d, DType::F32);
  model.params().initialize(26);
  randomize_weights(model, 0.3, 27);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const RunResult one = run_policy(model, b, RecomputePolicy::None, 0);
  for (int n : {2, 3}) {
    omp_set_num_threads(n);
    expect_same_bits(run_policy(model, b, RecomputePolicy::None, 0), one, model, std::to_string(n) + " threads");
    expect_same_bits(run_policy(model, b, RecomputePolicy::Selective, 0), one, model,
                     std::to_string(n) + " threads, selective");
    expect_same_bits(run_policy(model, b, RecomputePolicy::Full, 1), one, model, std::to_string(n) + " threads, full 1");
  }
  omp_set_num_threads(threads);
}

// The activation peak of each policy on a model of some size (C=64, L=4, T=128, B=2, fp32):
// none > selective > full (all layers); full with half the layers lies between.
void check_activation_peak_falls(const ModelDims& d) {
  const Batch b = random_batch(d.V, 2, 128, 10);
  NsaTransformer model(d, DType::F32);
  model.params().initialize(24);
  const std::size_t none = run_policy(model, b, RecomputePolicy::None, 0).peak;
  const std::size_t sel = run_policy(model, b, RecomputePolicy::Selective, 0).peak;
  const std::size_t full = run_policy(model, b, RecomputePolicy::Full, d.L).peak;
  const std::size_t half = run_policy(model, b, RecomputePolicy::Full, d.L / 2).peak;
  std::printf("  activation peak, V=%lld C=%lld L=%lld H=%lld G=%lld D=%lld F=%lld, B=%lld T=%lld, fp32:\n"
              "    none        %zu bytes (%.1f KiB)\n    selective   %zu bytes (%.1f KiB)\n"
              "    full (L=%lld) %zu bytes (%.1f KiB)\n    full (L/2)  %zu bytes (%.1f KiB)\n",
              (long long)d.V, (long long)d.C, (long long)d.L, (long long)d.H, (long long)d.G, (long long)d.D,
              (long long)d.F, (long long)b.B, (long long)b.T, none, none / 1024.0, sel, sel / 1024.0,
              (long long)d.L, full, full / 1024.0, half, half / 1024.0);
  EXPECT_GT(none, 0u);
  EXPECT_LT(sel, none);
  EXPECT_LT(full, sel);
  EXPECT_LT(full, half);
  EXPECT_LT(half, none);
}
TEST(ModelRecompute, ActivationPeakFalls) { check_activation_peak_falls(mid_dims()); }
TEST(ModelRecompute, ActivationPeakFallsDense) { check_activation_peak_falls(dense(mid_dims())); }

// The figure counts what each policy keeps: at the end of the forward every layer's kept
// activations are live at once, so the peak is at least L times one layer's share (model.h:
// "none" keeps every activation the backward reads, the NSA core's saved state included;
// "selective" drops the norm outputs, the SwiGLU output and the core's saved state; "full"
// keeps the layer input).
TEST(ModelRecompute, ActivationPeakCountsWhatIsKept) {
  const ModelDims d = mid_dims();
  const Batch b = random_batch(d.V, 2, 128, 11);
  const std::size_t E = sizeof(float), N = std::size_t(b.B * b.T);
  const std::size_t C = std::size_t(d.C), HD = std::size_t(d.H * d.D), GD = std::size_t(d.G * d.D);
  nsa::NsaDims core;
  core.B = b.B, core.T = b.T, core.H = d.H, core.G = d.G, core.D = d.D;
  core.cmp_block = d.cmp_block, core.cmp_stride = d.cmp_stride, core.sel_block = d.sel_block;
  core.sel_count = d.sel_count, core.window = d.window, core.rope_theta = d.rope_theta;
  const std::size_t core_saved = nsa::NsaSaved<float>::bytes_for(core);
  const std::size_t input = N * C * E;
  const std::size_t selective = input /* x */ + N * E /* rstd1 */ + N * (HD + 6 * GD + 3 * std::size_t(d.H)) * E +
                                N * HD * E /* o */ + N * C * E /* h */ + N * E /* rstd2 */ +
                                N * 2 * std::size_t(d.F) * E /* u */;
  const std::size_t all = selective + 2 * N * C * E /* xn, hn */ + N * std::size_t(d.F) * E /* act */ + core_saved;

  NsaTransformer model(d, DType::F32);
  model.params().initialize(25);
  const std::size_t none = run_policy(model, b, RecomputePolicy::None, 0).peak;
  const std::size_t sel = run_policy(model, b, RecomputePolicy::Selective, 0).peak;
  const std::size_t full = run_policy(model, b, RecomputePolicy::Full, d.L).peak;
  std::printf("  kept per layer: none %zu (NSA core state %zu), selective %zu, full %zu bytes\n", all, core_saved,
              selective, input);
  EXPECT_GE(none, std::size_t(d.L) * all) << "the peak of 'none' misses part of what it keeps";
  EXPECT_GE(sel, std::size_t(d.L) * selective);
  EXPECT_GE(full, std::size_t(d.L) * input);
}

}  // namespace
}  // namespace nsatron::test
