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
//
// What accumulation must guarantee, checked in a form that holds whatever BLAS kernel the
// machine's OpenBLAS picks (scripts/test_blas_variants.sh runs this under several):
//   1. the accumulated gradient is the sum of the micro-batch gradients: each micro-batch's
//      gradient is added into the buffer, scaled by 1/k, none dropped or counted twice. The
//      micro-batches have the same shapes whether run alone or accumulated, so the same
//      kernels compute the same partial products; only the k - 1 additions into the buffer
//      round. This is checked element by element against a bound made of the unit roundoff.
//   2. it is the whole batch's gradient: the same sum in another grouping (the matrix
//      products run over B*T rows at once instead of B*T/k), so here the two fp32 results
//      differ by the kernels' rounding, which depends on the kernel (bound and reason below).
//   3. one AdamW step from the accumulated gradient is the step from the whole batch's
//      gradient. On the first step AdamW moves each weight by lr * g / (|g| + eps) (plus the
//      decay, the same for both), so a gradient near zero turns its rounding difference into a
//      weight difference of up to lr: comparing the weights with a relative bound measures the
//      kernel. Instead the weights' difference must be the one AdamW's formula gives for the
//      two gradients, element by element, up to the rounding of the weights and the moments.

struct AccumResult {
  double loss = 0;                              // mean of the micro-batch losses
  std::vector<double> grads;                    // accumulated over the micro-batches
  std::vector<std::vector<double>> micro_grads;  // each micro-batch's alone (grad_scale 1/k)
  std::vector<double> weights_before;           // the weights of the step
  std::vector<double> weights;                  // after one AdamW step on `grads`
};

constexpr AdamWHyper kAccumHyper{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

// Splits the batch into k micro-batches of B/k sequences, each with grad_scale 1/k: first
// each alone (its own gradient), then accumulated into one buffer, then one AdamW step.
AccumResult run_accumulated(const ModelDims& dims, DType dtype, const Batch& batch, std::int64_t k) {
  NsaTransformer model(dims, dtype);
  model.params().initialize(5);
  randomize_weights(model, 0.4, 6);
  AccumResult r;
  const std::int64_t per = batch.B / k;
  for (std::int64_t i = 0; i < k; ++i) {
    const Batch mb = sub_batch(batch, i * per, (i + 1) * per);
    model.params().zero_grads();
    model.forward_backward(mb.tokens, mb.targets, mb.B, mb.T, 1.0 / double(k));
    r.micro_grads.push_back(model.params().flat_grads().to_vector());
  }
  model.params().zero_grads();
  for (std::int64_t i = 0; i < k; ++i) {
    const Batch mb = sub_batch(batch, i * per, (i + 1) * per);
    r.loss += model.forward_backward(mb.tokens, mb.targets, mb.B, mb.T, 1.0 / double(k)) / double(k);
  }
  r.grads = model.params().flat_grads().to_vector();

  std::vector<ParamSegment> segs;
  for (const auto& p : model.params().infos()) segs.push_back({p.offset, p.numel, p.decay});
  const std::int64_t n = model.params().total();
  Tensor m = Tensor::zeros({n}, dtype), v = Tensor::zeros({n}, dtype);
  r.weights_before = model.params().flat_weights().to_vector();
  adamw_step(model.params().flat_weights(), model.params().flat_grads(), m, v, segs, kAccumHyper, 1);
  r.weights = model.params().flat_weights().to_vector();
  return r;
}

// The direction of AdamW's first step for gradient g: m / (sqrt(v) + eps) after bias
// correction is g / (|g| + eps) (adamw.h), exactly, in fp64.
double first_step_direction(double g) { return g / (std::fabs(g) + kAccumHyper.eps); }

void check_accumulation(DType dtype, Attention attention = Attention::Nsa) {
  // Unit roundoff of the storage type: every stored value is within u |x| of the exact one.
  const double u = dtype == DType::F32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
  ModelDims dims = tiny_dims(false);
  dims.L = 3;
  dims.attention = attention;
  const Batch batch = random_batch(dims.V, 4, 17, 99);
  // Property 2's bound, relative to each tensor's largest gradient (and to the loss): the
  // whole batch and the micro-batches are the same sums grouped differently. The backward's
  // matrix products sum over the B*T positions in an order each BLAS kernel picks (and over
  // C, 3C or F in the forward, fewer terms); a reordered sum of n terms moves by up to about
  // n u times the sum of its terms' sizes, and each of the L layers adds its own: L * B*T * u
  // (fp32 1.2e-5, fp64 2.3e-14). Measured worst: fp32 3.1e-6 (OpenBLAS Haswell and Zen
  // kernels), 3e-7 to 7e-7 (SkylakeX, Sandybridge, Prescott); fp64 2.1e-15.
  const double whole_batch_rtol = double(dims.L * batch.B * batch.T) * u;
  const AccumResult one = run_accumulated(dims, dtype, batch, 1);
  NsaTransformer shape_only(dims, dtype);
  for (std::int64_t k : {2, 4}) {
    const AccumResult acc = run_accumulated(dims, dtype, batch, k);
    ASSERT_EQ(acc.weights_before, one.weights_before);
    // The loss is the mean of per-position losses, each from logits that went through the same
    // kernels' rounding as the gradients: the bound of property 2.
    EXPECT_NEAR(acc.loss, one.loss, whole_batch_rtol * std::fabs(one.loss)) << k << " micro-batches: loss";
    double worst_sum = 0, worst_g = 0, worst_step = 0;
    for (const auto& p : shape_only.params().infos()) {
      // 1. The sum of the micro-batch gradients. Run alone, a micro-batch's gradient is its
      // terms summed from zero; accumulated, the same terms are summed onto what the buffer
      // holds. Each of those additions rounds by at most u times the running sum, which is at
      // most the magnitude sum_i |g_i| of the micro-batch gradients plus a partial sum of one
      // micro-batch's terms. Where an op sums its terms in a wider type and adds once (fp32:
      // the matrix products' dot products, the embedding rows, summed in fp64) that is k - 1
      // roundings of at most u sum_i |g_i|; where it adds term by term in the storage type
      // (fp64: the embedding rows) up to N = B*T/k more, each of at most u times a partial sum
      // of the micro-batch, which is of the size of the tensor's gradients (`scale`, the
      // largest sum_i |g_i| of the tensor). Twice both, for the bound.
      const double positions = double(batch.B * batch.T / k);
      double scale = 0;
      for (std::int64_t e = p.offset; e < p.offset + p.numel; ++e) {
        double magnitude = 0;
        for (const auto& g : acc.micro_grads) magnitude += std::fabs(g[std::size_t(e)]);
        scale = std::max(scale, magnitude);
      }
      std::int64_t bad_sum = 0;
      for (std::int64_t e = p.offset; e < p.offset + p.numel; ++e) {
        double exact = 0, magnitude = 0;
        for (const auto& g : acc.micro_grads) exact += g[std::size_t(e)], magnitude += std::fabs(g[std::size_t(e)]);
        const double err = std::fabs(acc.grads[std::size_t(e)] - exact);
        const double rounding = u * (double(k) * magnitude + positions * scale);
        if (rounding > 0) worst_sum = std::max(worst_sum, err / rounding);
        if (!(err <= 2 * rounding) && bad_sum++ == 0)
          ADD_FAILURE() << k << " micro-batches: " << p.name << "[" << e - p.offset << "]: accumulated gradient "
                        << acc.grads[std::size_t(e)] << " but the micro-batch gradients sum to " << exact
                        << " (bound " << 2 * rounding << ")";
      }
      // 2. The whole batch's gradient, to whole_batch_rtol of the tensor's largest gradient.
      const double eg = rel_err(acc.grads, one.grads, p.offset, p.numel);
      worst_g = std::max(worst_g, eg);
      EXPECT_LE(eg, whole_batch_rtol) << k << " micro-batches: gradient of " << p.name;
      // 3. The AdamW step: w_acc - w_one = -lr (d(g_acc) - d(g_one)) in exact arithmetic (the
      // decay acts on the same weights). Each run rounds its new weight (u |w|) and, on the
      // way, its m and v (stored: u each), sqrt, the bias corrections, + eps, the division and
      // the product with the step size (fp64 arithmetic: at most u each): at most 8u relative
      // on a direction whose size is at most 1, so 8u lr per run.
      std::int64_t bad_step = 0;
      for (std::int64_t e = p.offset; e < p.offset + p.numel; ++e) {
        const std::size_t i = std::size_t(e);
        const double want = -kAccumHyper.lr * (first_step_direction(acc.grads[i]) - first_step_direction(one.grads[i]));
        const double got = acc.weights[i] - one.weights[i];
        const double slack =
            u * (std::fabs(acc.weights[i]) + std::fabs(one.weights[i])) + 2 * 8 * u * kAccumHyper.lr;
        worst_step = std::max(worst_step, std::fabs(got - want) / slack);
        if (!(std::fabs(got - want) <= slack) && bad_step++ == 0)
          ADD_FAILURE() << k << " micro-batches: " << p.name << "[" << e - p.offset
                        << "] after one AdamW step: weights differ by " << got << ", the gradients ("
                        << acc.grads[i] << " and " << one.grads[i] << ") explain " << want << " (slack " << slack
                        << ")";
      }
    }
    std::printf("  %s, %lld micro-batches: loss %.9g vs %.9g; accumulated vs sum of micro-batch gradients: "
                "worst %.2f of its rounding; vs whole batch: worst relative error %.2e; AdamW step: worst %.2f "
                "of its rounding slack\n",
                std::string(dtype_name(dtype)).c_str(), (long long)k, acc.loss, one.loss, worst_sum, worst_g,
                worst_step);
  }
  // Something must have moved: the step is not a no-op.
  EXPECT_GT(rel_err(one.weights, one.weights_before, 0, std::int64_t(one.weights.size())), 1e-3);
}

TEST(ModelAccumulation, Fp32) { check_accumulation(DType::F32); }
TEST(ModelAccumulation, Fp64) { check_accumulation(DType::F64); }
TEST(ModelAccumulation, DenseFp32) { check_accumulation(DType::F32, Attention::Dense); }
TEST(ModelAccumulation, DenseFp64) { check_accumulation(DType::F64, Attention::Dense); }

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
