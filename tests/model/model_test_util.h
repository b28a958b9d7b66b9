// Helpers for the model tests: tiny model shapes, random token batches, random weights, and
// comparisons of flat buffers.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/model/params.h"

namespace nsatron::test {

// The tiny shape of the gradient checks: NSA blocks l=4, d=2, l'=4, n=3, w=5, so that with
// T around 13 the compression branch has several blocks, the selection several eligible
// blocks, and the window is shorter than the sequence.
inline ModelDims tiny_dims(bool tie = true, std::int64_t G = 2) {
  ModelDims d{};
  d.V = 11;
  d.C = 8;
  d.L = 2;
  d.H = 4;
  d.G = G;
  d.D = 4;
  d.F = 12;
  d.cmp_block = 4;
  d.cmp_stride = 2;
  d.sel_block = 4;
  d.sel_count = 3;
  d.window = 5;
  d.rope_theta = 10000.0;
  d.norm_eps = 1e-5;
  d.init_std = 0.02;
  d.tie_embeddings = tie;
  return d;
}

// A mid-size shape for the recompute memory figures (C=64, L=4; T=128 with B=2).
inline ModelDims mid_dims() {
  ModelDims d{};
  d.V = 256;
  d.C = 64;
  d.L = 4;
  d.H = 4;
  d.G = 2;
  d.D = 16;
  d.F = 176;
  d.cmp_block = 16;
  d.cmp_stride = 8;
  d.sel_block = 32;
  d.sel_count = 3;
  d.window = 48;
  d.rope_theta = 10000.0;
  d.norm_eps = 1e-5;
  d.init_std = 0.02;
  d.tie_embeddings = true;
  return d;
}

// The same shape with dense attention (model.attention = "dense"; the NSA settings unused).
inline ModelDims dense(ModelDims d) {
  d.attention = Attention::Dense;
  return d;
}

struct Batch {
  std::vector<std::int32_t> tokens, targets;
  std::int64_t B = 0, T = 0;
};

inline Batch random_batch(std::int64_t V, std::int64_t B, std::int64_t T, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<std::int32_t> id(0, std::int32_t(V - 1));
  Batch b;
  b.B = B;
  b.T = T;
  for (std::int64_t i = 0; i < B * T; ++i) {
    b.tokens.push_back(id(gen));
    b.targets.push_back(id(gen));
  }
  return b;
}

// Rows [b0, b1) of the batch's sequences.
inline Batch sub_batch(const Batch& b, std::int64_t b0, std::int64_t b1) {
  Batch s;
  s.B = b1 - b0;
  s.T = b.T;
  s.tokens.assign(b.tokens.begin() + b0 * b.T, b.tokens.begin() + b1 * b.T);
  s.targets.assign(b.targets.begin() + b0 * b.T, b.targets.begin() + b1 * b.T);
  return s;
}

// Every weight set to normal(0, sd) (norm gains included: 1 + normal(0, sd), so that no gain
// sits at its trivial value of exactly 1 yet none is near 0).
inline void randomize_weights(NsaTransformer& model, double sd, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> nd(0.0, sd);
  std::vector<double> w(std::size_t(model.params().total()));
  for (const auto& p : model.params().infos())
    for (std::int64_t i = 0; i < p.numel; ++i)
      w[std::size_t(p.offset + i)] = (p.init_one ? 1.0 : 0.0) + nd(gen);
  Tensor& flat = model.params().flat_weights();
  flat.copy_from(Tensor::from_vector(w, {model.params().total()}, flat.dtype()));
}

// max |a - b| / max |b| over the slice [off, off + n) of two flat vectors (0 when both are 0).
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b, std::int64_t off,
                      std::int64_t n) {
  double err = 0, ref = 0;
  for (std::int64_t i = off; i < off + n; ++i) {
    err = std::max(err, std::fabs(a[std::size_t(i)] - b[std::size_t(i)]));
    ref = std::max(ref, std::fabs(b[std::size_t(i)]));
  }
  if (ref == 0) return err == 0 ? 0.0 : INFINITY;
  return err / ref;
}

// A group of `size` ranks of which this process plays `rank`: collectives leave their
// tensors as they are, receives fill zeros. Values are meaningless; shapes, and so memory,
// are those of the real run.
class FakeGroup final : public parallel::Communicator {
 public:
  // ahead: as the MPI backend, posts_ahead() (the transfers still run at start time: nothing
  // is in flight here, only the buffers' lifetimes follow run_1f1b's events).
  FakeGroup(int rank, int size, bool ahead = false) : rank_(rank), size_(size), ahead_(ahead) {}
  bool posts_ahead() const override { return ahead_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "fake"; }
  bool supports(DType, Device) const override { return true; }

 protected:
  void do_all_reduce(Tensor&, parallel::ReduceOp) override {}
  void do_all_gather(const Tensor&, Tensor&, bool) override {}
  void do_reduce_scatter(const Tensor&, Tensor&, parallel::ReduceOp) override {}
  void do_broadcast(Tensor&, int) override {}
  void do_send(const Tensor&, int) override {}
  void do_recv(Tensor& t, int) override { t.zero_(); }
  void do_send_recv(const Tensor&, int, Tensor& recv, int) override {
    if (recv.defined() && recv.numel() > 0) recv.zero_();
  }
  void do_barrier() override {}

 private:
  int rank_, size_;
  bool ahead_;
  std::string name_ = "fake";
};

}  // namespace nsatron::test
