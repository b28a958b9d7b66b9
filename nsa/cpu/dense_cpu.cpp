// Dense causal attention on the CPU (nsa/dense.h): the NSA window branch's code with the
// window covering every earlier token and the gate fixed at 1.
//
// Forward, per (batch b, query t, group g), the h heads of the group together: rotate q,
// attend over the keys [0, t] (attend_forward writes o and lse straight into the outputs).
// Backward: delta = do . o; the query side per (b, t, g) (attend_backward_query, then the
// inverse rotation); the key side per (b, g, key tile) (window_backward_keys with w = T).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "core/util/error.h"
#include "nsa/cpu/attention.h"
#include "nsa/cpu/rope.h"
#include "nsa/dense.h"

namespace nsatron::nsa {

using cpu::KeyRange;

void DenseDims::validate() const {
  if (const std::string p = attention_shape_problem(B, T, H, G, D, rope_theta); !p.empty())
    throw UserError("dense attention (" + str() + "): " + p);
}

std::string DenseDims::str() const {
  std::ostringstream os;
  os << "B=" << B << " T=" << T << " H=" << H << " G=" << G << " D=" << D << " theta=" << rope_theta;
  return os.str();
}

NsaDims DenseDims::as_window() const {
  NsaDims d;  // the NSA block settings keep their (valid) defaults; the window branch ignores them
  d.B = B;
  d.T = T;
  d.H = H;
  d.G = G;
  d.D = D;
  d.window = T;
  d.rope_theta = rope_theta;
  return d;
}

template <class Real>
void dense_forward(const DenseDims& dims, const Real* q, const Real* k, const Real* v, Real* out, Real* lse) {
  dims.validate();
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, G = dims.G, D = dims.D, h = dims.heads_per_group();
  const Real scale = Real(1) / std::sqrt(Real(D));
  const cpu::RopeTable<Real> rope(T, D, dims.rope_theta);
  std::vector<Real> k_rot(static_cast<std::size_t>(B * T * G * D));
  cpu::rotate_token_rows(rope, B, T, G, D, k, k_rot.data());
#pragma omp parallel
  {
    std::vector<Real> qr(static_cast<std::size_t>(h * D)), scores(static_cast<std::size_t>(h * T));
    std::vector<Real> lse_local(static_cast<std::size_t>(h));
#pragma omp for schedule(dynamic, 8)
    for (std::int64_t item = 0; item < B * T * G; ++item) {
      const std::int64_t g = item % G, t = (item / G) % T, b = item / (G * T);
      const std::int64_t head0 = (b * T + t) * H + g * h, tok_row0 = (b * T * G + g) * D;
      for (std::int64_t a = 0; a < h; ++a) rope.rotate(q + (head0 + a) * D, qr.data() + a * D, t);
      const KeyRange keys{0, t + 1};
      cpu::attend_forward(qr.data(), h, D, scale, k_rot.data() + tok_row0, v + tok_row0, G * D, &keys, 1,
                          scores.data(), out + head0 * D, lse ? lse + head0 : lse_local.data());
    }
  }
}

template <class Real>
void dense_backward(const DenseDims& dims, const Real* q, const Real* k, const Real* v, const Real* out,
                    const Real* lse, const Real* d_out, Real* dq, Real* dk, Real* dv) {
  dims.validate();
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, G = dims.G, D = dims.D, h = dims.heads_per_group();
  const std::int64_t BTH = B * T * H;
  const Real scale = Real(1) / std::sqrt(Real(D));
  const NsaDims window = dims.as_window();
  const cpu::RopeTable<Real> rope(T, D, dims.rope_theta);
  std::vector<Real> q_rot(static_cast<std::size_t>(BTH * D)), k_rot(static_cast<std::size_t>(B * T * G * D));
  cpu::rotate_token_rows(rope, B, T, H, D, q, q_rot.data());
  cpu::rotate_token_rows(rope, B, T, G, D, k, k_rot.data());

  // The gate is 1, so delta = do . o.
  std::vector<Real> ones(static_cast<std::size_t>(BTH), Real(1)), delta(static_cast<std::size_t>(BTH));
#pragma omp parallel for schedule(static)
  for (std::int64_t row = 0; row < BTH; ++row) delta[static_cast<std::size_t>(row)] = cpu::dot(d_out + row * D, out + row * D, D);
  const cpu::BackwardContext<Real> ctx{q_rot.data(), d_out, ones.data(), lse, delta.data(), 0};

  if (dq) {
#pragma omp parallel
    {
      std::vector<Real> dqr(static_cast<std::size_t>(h * D));
#pragma omp for schedule(dynamic, 8)
      for (std::int64_t item = 0; item < B * T * G; ++item) {
        const std::int64_t g = item % G, t = (item / G) % T, b = item / (G * T);
        const std::int64_t head0 = (b * T + t) * H + g * h, tok_row0 = (b * T * G + g) * D;
        cpu::zero(dqr.data(), h * D);
        const KeyRange keys{0, t + 1};
        cpu::attend_backward_query(ctx.rows(window, kBranchWin, b, t, g), h, D, scale, k_rot.data() + tok_row0,
                                   v + tok_row0, G * D, &keys, 1, dqr.data());
        for (std::int64_t a = 0; a < h; ++a) rope.rotate_back(dqr.data() + a * D, dq + (head0 + a) * D, t);
      }
    }
  }
  if (dk || dv) {
    std::vector<Real> scratch;
    if (!dk || !dv) scratch.resize(static_cast<std::size_t>(B * T * G * D));
    cpu::window_backward_keys(window, ctx, k_rot.data(), v, rope, dk ? dk : scratch.data(), dv ? dv : scratch.data());
  }
}

template void dense_forward<float>(const DenseDims&, const float*, const float*, const float*, float*, float*);
template void dense_forward<double>(const DenseDims&, const double*, const double*, const double*, double*, double*);
template void dense_backward<float>(const DenseDims&, const float*, const float*, const float*, const float*,
                                    const float*, const float*, float*, float*, float*);
template void dense_backward<double>(const DenseDims&, const double*, const double*, const double*, const double*,
                                     const double*, const double*, double*, double*, double*);

}  // namespace nsatron::nsa
