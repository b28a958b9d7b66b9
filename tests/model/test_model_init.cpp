// Initialisation (deterministic, per-parameter streams independent of the others, the
// documented scales) and flops_per_token (positive, increasing with T, equal to an
// independent count of matrix parameters and attended keys).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "tests/model/model_test_util.h"

namespace nsatron::test {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(ModelInit, SameSeedSameBits) {
  for (DType t : {DType::F32, DType::F64}) {
    NsaTransformer a(tiny_dims(false), t), b(tiny_dims(false), t);
    a.params().initialize(1234);
    b.params().initialize(1234);
    EXPECT_TRUE(same_bits(a.params().flat_weights(), b.params().flat_weights())) << dtype_name(t);
    // Initialising again (over trained values, with gradients present) gives the same bits.
    randomize_weights(b, 1.0, 5);
    b.params().flat_grads().copy_from(b.params().flat_weights());
    b.params().initialize(1234);
    EXPECT_TRUE(same_bits(a.params().flat_weights(), b.params().flat_weights())) << dtype_name(t);
    for (double g : b.params().flat_grads().to_vector()) ASSERT_EQ(g, 0.0) << "initialize() zeroes the gradients";
  }
}

TEST(ModelInit, DifferentSeedDiffers) {
  NsaTransformer a(tiny_dims(false), DType::F64), b(tiny_dims(false), DType::F64);
  a.params().initialize(1);
  b.params().initialize(2);
  for (const auto& p : a.params().infos()) {
    const std::vector<double> x = a.params().weight(p).to_vector(), y = b.params().weight(p).to_vector();
    std::int64_t equal = 0;
    for (std::size_t i = 0; i < x.size(); ++i) equal += x[i] == y[i];
    if (p.init_one) {
      EXPECT_EQ(equal, p.numel) << p.name << ": norm gains are 1 whatever the seed";
    } else {
      EXPECT_EQ(equal, 0) << p.name << ": " << equal << " of " << p.numel << " elements unchanged by the seed";
    }
  }
}

// fp32 weights are the fp64 draws rounded: the init does not depend on the dtype.
TEST(ModelInit, Fp32IsRoundedFp64) {
  NsaTransformer a(tiny_dims(true), DType::F32), b(tiny_dims(true), DType::F64);
  a.params().initialize(77);
  b.params().initialize(77);
  const std::vector<double> x = a.params().flat_weights().to_vector(), y = b.params().flat_weights().to_vector();
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], double(float(y[i]))) << i;
}

// A parameter's values depend on (seed, name) only: the tied and the untied model (the latter
// has one more parameter, lm_head, at the end) share every common parameter bit for bit, as do
// models with different numbers of layers (up to the 1/sqrt(2L) scale of the residual
// projections) or of KV groups (parameters whose shape does not change).
TEST(ModelInit, IndependentOfOtherParameters) {
  NsaTransformer tied(tiny_dims(true), DType::F64), untied(tiny_dims(false), DType::F64);
  tied.params().initialize(9);
  untied.params().initialize(9);
  EXPECT_EQ(untied.params().infos().size(), tied.params().infos().size() + 1);
  for (const auto& p : tied.params().infos())
    EXPECT_TRUE(same_bits(tied.params().weight(p.name), untied.params().weight(p.name))) << p.name;
  const std::vector<double> e = untied.params().weight("model/embedding").to_vector();
  const std::vector<double> h = untied.params().weight("model/lm_head").to_vector();
  std::int64_t equal = 0;
  for (std::size_t i = 0; i < e.size(); ++i) equal += e[i] == h[i];
  EXPECT_EQ(equal, 0) << "lm_head must be its own draw, not a copy of the embedding";

  ModelDims d3 = tiny_dims(true);
  d3.L = 3;
  NsaTransformer deeper(d3, DType::F64);
  deeper.params().initialize(9);
  const double ratio = std::sqrt(2.0 * 2.0) / std::sqrt(2.0 * 3.0);  // resid std of L=3 over L=2
  for (const auto& p : tied.params().infos()) {
    const std::vector<double> x = tied.params().weight(p.name).to_vector(), y = deeper.params().weight(p.name).to_vector();
    const bool resid = p.name.ends_with("/attn/wo") || p.name.ends_with("/mlp/w_out");
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (resid) {
        ASSERT_NEAR(y[i], x[i] * ratio, 1e-15 * std::fabs(x[i])) << p.name << "[" << i << "]";
      } else {
        ASSERT_EQ(y[i], x[i]) << p.name << "[" << i << "]";
      }
    }
  }

  NsaTransformer one_group(tiny_dims(true, 1), DType::F64);
  one_group.params().initialize(9);
  for (const auto& p : one_group.params().infos()) {
    if (p.shape == tied.params().info(p.name).shape) {
      EXPECT_TRUE(same_bits(one_group.params().weight(p.name), tied.params().weight(p.name))) << p.name;
    }
  }
}

// Scales (issue 4: init_std, residual projections by 1/sqrt(2 L); the compression maps by
// 1/sqrt(l D); gains 1) and the weight-decay flags (not on norms or position embeddings).
void check_scales_and_decay(Attention attention) {
  ModelDims d = mid_dims();
  d.tie_embeddings = false;
  d.attention = attention;
  NsaTransformer model(d, DType::F64);
  model.params().initialize(3);
  const double resid = d.init_std / std::sqrt(2.0 * double(d.L));
  const double cmp = 1.0 / std::sqrt(double(d.cmp_block * d.D));
  for (const auto& p : model.params().infos()) {
    const std::string& n = p.name;
    double want = d.init_std;
    bool decay = true, one = false;
    if (n.ends_with("norm")) want = 0, decay = false, one = true;
    else if (n.ends_with("/wo") || n.ends_with("/w_out")) want = resid;
    else if (n.ends_with("/cmp_wk") || n.ends_with("/cmp_wv")) want = cmp;
    else if (n.ends_with("/cmp_pk") || n.ends_with("/cmp_pv")) decay = false;
    EXPECT_EQ(p.decay, decay) << n;
    const std::vector<double> v = model.params().weight(p).to_vector();
    if (one) {
      for (double x : v) ASSERT_EQ(x, 1.0) << n;
      continue;
    }
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double mean = s / double(v.size()), sd = std::sqrt(s2 / double(v.size()));
    // Sample statistics of n normals: sd within 5 standard errors (sd * 5 / sqrt(2n)), mean
    // within 5 * sd / sqrt(n).
    const double nn = double(v.size());
    EXPECT_NEAR(sd, want, 5 * want / std::sqrt(2 * nn)) << n << " (" << p.numel << " elements)";
    EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(nn)) << n;
  }
  // The parameter count: embedding, per layer, final norm, head.
  const bool nsa = attention == Attention::Nsa;
  const std::int64_t cmp_maps = nsa ? 2 * d.G * d.cmp_block * d.D * d.D + 2 * d.G * d.cmp_block * d.D : 0;
  const std::int64_t per_layer = 2 * d.C + d.G * d.group_width() * d.C + cmp_maps + d.C * d.H * d.D + 3 * d.F * d.C;
  EXPECT_EQ(model.num_params(), 2 * d.V * d.C + d.L * per_layer + d.C);
  // wqkv per group: NSA q, six K/V and three gate logits per head; dense q, k, v.
  EXPECT_EQ(d.group_width(), nsa ? d.heads_per_group() * d.D + 6 * d.D + 3 * d.heads_per_group()
                                 : d.heads_per_group() * d.D + 2 * d.D);
}
TEST(ModelInit, ScalesAndDecayFlags) { check_scales_and_decay(Attention::Nsa); }
TEST(ModelInit, ScalesAndDecayFlagsDense) { check_scales_and_decay(Attention::Dense); }

// Dense attention has the NSA model's parameters less the compression maps, with the same
// names, and wqkv of [G * (h + 2) * D, C]; drawn from (seed, name), every parameter of the
// same shape starts with the same values in both models (an NSA-dense comparison at one seed
// starts from the same embedding, norms, wo and MLP).
TEST(ModelInit, DenseParametersAreNsaLessTheCompression) {
  const ModelDims nd = tiny_dims(true), dd = dense(tiny_dims(true));
  std::vector<std::string> want;
  for (const std::string& n : NsaTransformer::parameter_names(nd))
    if (n.find("/cmp_") == std::string::npos) want.push_back(n);
  EXPECT_EQ(NsaTransformer::parameter_names(dd), want);
  NsaTransformer nsa(nd, DType::F64), den(dd, DType::F64);
  nsa.params().initialize(4);
  den.params().initialize(4);
  for (const auto& p : den.params().infos()) {
    if (p.name.ends_with("/attn/wqkv")) {
      EXPECT_EQ(p.shape, (Shape{dd.G * (dd.heads_per_group() + 2) * dd.D, dd.C}));
      continue;
    }
    EXPECT_TRUE(same_bits(den.params().weight(p.name), nsa.params().weight(p.name))) << p.name;
  }
}

// ---- FLOPs ---------------------------------------------------------------------------------

ModelDims dims_125m() {
  ModelDims d{};
  d.V = 50304, d.C = 768, d.L = 12, d.H = 12, d.G = 2, d.D = 64, d.F = 2048;
  d.cmp_block = 32, d.cmp_stride = 16, d.sel_block = 64, d.sel_count = 16, d.window = 512;
  d.rope_theta = 10000, d.norm_eps = 1e-5, d.init_std = 0.02, d.tie_embeddings = true;
  return d;
}

// An independent count: 6 x (the 2-D weight matrices of the layers, found by shape in the
// parameter list, plus V*C for the head), the compression maps (two [l*D] x [l*D, D] products
// per compressed block and group), and 12 H D per key attended, keys enumerated per query:
// the visible compressed blocks, the tokens s <= t of the min(n, b_t + 1) selected blocks
// (all full except the query's own), the window.
// Dense attention: the keys s <= t of each query, no compression maps.
double count_flops(const NsaTransformer& model, std::int64_t T) {
  const ModelDims& m = model.dims();
  double matrix = double(m.V * m.C);  // the head (the embedding lookup costs no matmul)
  for (const auto& p : model.params().infos())
    if (p.shape.size() == 2 && p.name.find("/layers.") != std::string::npos) matrix += double(p.numel);
  if (m.attention == Attention::Dense) {
    double keys = 0;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t s = 0; s <= t; ++s) keys += 1;
    return 6.0 * matrix + 12.0 * double(m.L * m.H * m.D) * keys / double(T);
  }
  const std::int64_t N = T >= m.cmp_block ? (T - m.cmp_block) / m.cmp_stride + 1 : 0;
  double keys = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i = 0; i < N; ++i) keys += (i * m.cmp_stride + m.cmp_block - 1 <= t);
    const std::int64_t bt = t / m.sel_block;
    const std::int64_t blocks = std::min(m.sel_count, bt + 1);
    keys += double((blocks - 1) * m.sel_block + (t - bt * m.sel_block + 1));
    for (std::int64_t s = std::max<std::int64_t>(0, t - m.window + 1); s <= t; ++s) keys += 1;
  }
  const double cmp_maps = double(m.L * N * m.G) * 2.0 * 2.0 * double(m.cmp_block * m.D * m.D) / double(T);
  return 6.0 * matrix + 3.0 * cmp_maps + 12.0 * double(m.L * m.H * m.D) * keys / double(T);
}

TEST(ModelFlops, MatchesIndependentCount) {
  for (const ModelDims& d : {tiny_dims(true), tiny_dims(false, 1), mid_dims(), dims_125m(), dense(tiny_dims(false, 1)),
                            dense(mid_dims())}) {
    NsaTransformer model(d, DType::F32);
    for (std::int64_t T : {1, 3, 4, 5, 13, 64, 127, 128, 1000, 2048, 4096}) {
      if (T > 2048 && d.V < 1000) continue;
      const double want = count_flops(model, T), got = model.flops_per_token(T);
      EXPECT_NEAR(got, want, 1e-12 * want) << "C=" << d.C << " T=" << T;
    }
  }
}

TEST(ModelFlops, PositiveAndIncreasingWithT) {
  for (const ModelDims& d : {tiny_dims(true), mid_dims(), dims_125m(), dense(mid_dims())}) {
    NsaTransformer model(d, DType::F32);
    double prev = 0;
    for (std::int64_t T = 1; T <= 65536; T *= 2) {
      const double f = model.flops_per_token(T);
      EXPECT_TRUE(std::isfinite(f) && f > 0) << "T=" << T;
      EXPECT_GT(f, prev) << "C=" << d.C << ": FLOPs per token must grow with T (T=" << T << ")";
      prev = f;
    }
    // Above the matrix floor at any T: 6 x (matrix parameters + head).
    double matrix = double(d.V * d.C);
    for (const auto& p : model.params().infos())
      if (p.shape.size() == 2 && p.name.find("/layers.") != std::string::npos) matrix += double(p.numel);
    EXPECT_GT(model.flops_per_token(1), 6.0 * matrix);
  }
  NsaTransformer m125(dims_125m(), DType::F32);
  const ModelDims d125 = dense(dims_125m());  // (the formula needs no model)
  std::printf("  125M shape (V=50304 C=768 L=12 H=12 G=2 D=64 F=2048, NSA 32/16/64/16/512): %lld parameters, "
              "flops_per_token(T=2048) = %.6e (6 x params = %.6e)\n",
              (long long)m125.num_params(), m125.flops_per_token(2048), 6.0 * double(m125.num_params()));
  std::printf("  the same with dense attention: flops_per_token(T=2048) = %.6e, T=8192: %.6e (NSA %.6e)\n",
              d125.flops_per_token(2048), d125.flops_per_token(8192), m125.flops_per_token(8192));
  // Past the window, dense attention costs more per token than NSA's sparse branches.
  EXPECT_GT(d125.flops_per_token(8192), m125.flops_per_token(8192));
}

}  // namespace
}  // namespace nsatron::test
