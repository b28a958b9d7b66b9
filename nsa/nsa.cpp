// NsaDims validation and the saved-state size (see nsa.h).
#include "nsa/nsa.h"

#include <limits>
#include <sstream>

#include "core/util/error.h"

namespace nsatron::nsa {

std::string attention_shape_problem(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t G, std::int64_t D,
                                    double rope_theta) {
  if (B < 1 || T < 1) return "batch and sequence length must be >= 1";
  if (T > std::numeric_limits<std::int32_t>::max()) return "sequence length must fit in int32";
  if (H < 1) return "model.n_heads must be >= 1";
  if (G < 1) return "model.n_kv_heads must be >= 1";
  if (H % G != 0) return "model.n_heads must be a multiple of model.n_kv_heads (H % G == 0)";
  if (D < 2 || D % 2 != 0) return "model.head_dim must be even and >= 2 (RoPE rotates halves)";
  if (!(rope_theta > 0.0) || rope_theta == std::numeric_limits<double>::infinity())
    return "model.rope_theta must be a positive finite number";
  return "";
}

void NsaDims::validate() const {
  auto fail = [&](const std::string& what) {
    throw UserError("NSA attention (" + str() + "): " + what);
  };
  if (const std::string p = attention_shape_problem(B, T, H, G, D, rope_theta); !p.empty()) fail(p);
  if (cmp_block < 1) fail("nsa.cmp_block must be >= 1");
  if (cmp_stride < 1) fail("nsa.cmp_stride must be >= 1");
  if (sel_block < 1) fail("nsa.sel_block must be >= 1");
  if (cmp_block % cmp_stride != 0) fail("nsa.cmp_stride must divide nsa.cmp_block");
  if (sel_block % cmp_stride != 0) fail("nsa.cmp_stride must divide nsa.sel_block");
  if (cmp_block > sel_block) fail("nsa.cmp_block must be <= nsa.sel_block");
  if (sel_count < 3) fail("nsa.sel_count must be >= 3");
  if (window < 1) fail("nsa.window must be >= 1");
}

std::string NsaDims::str() const {
  std::ostringstream os;
  os << "B=" << B << " T=" << T << " H=" << H << " G=" << G << " D=" << D << " l=" << cmp_block
     << " d=" << cmp_stride << " l'=" << sel_block << " n=" << sel_count << " w=" << window
     << " theta=" << rope_theta;
  return os.str();
}

template <class Real>
std::size_t NsaSaved<Real>::bytes() const {
  return (k_cmp_blocks.size() + v_cmp_blocks.size() + o_branch.size() + lse.size()) *
             sizeof(Real) +
         sel_blocks.size() * sizeof(std::int32_t);
}

template <class Real>
std::size_t NsaSaved<Real>::bytes_for(const NsaDims& dm) {
  const std::size_t kv = static_cast<std::size_t>(2 * dm.B * dm.num_cmp_blocks() * dm.G * dm.D);
  const std::size_t o = static_cast<std::size_t>(3 * dm.B * dm.T * dm.H * dm.D);
  const std::size_t lse = static_cast<std::size_t>(3 * dm.B * dm.T * dm.H);
  const std::size_t sel = static_cast<std::size_t>(dm.B * dm.T * dm.G * dm.sel_count);
  return (kv + o + lse) * sizeof(Real) + sel * sizeof(std::int32_t);
}

template struct NsaSaved<float>;
template struct NsaSaved<double>;

}  // namespace nsatron::nsa
