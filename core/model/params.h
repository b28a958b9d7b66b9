// The model's parameters: one flat buffer of weights and one of gradients, each parameter a
// named view into them. Flat buffers make the fused AdamW update, the global gradient norm,
// zeroing, and the data-parallel all-reduce one call each.
//
// Names are paths ("model/layers.3/attn/wqkv"): checkpoints store one dataset per name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace nsatron {

struct ParamInfo {
  std::string name;
  Shape shape;
  std::int64_t offset = 0;  // elements into the flat buffers
  std::int64_t numel = 0;
  bool decay = true;        // AdamW weight decay applies (not to norms or position embeddings)
  double init_std = 0.0;    // normal(0, init_std); 0 with init_one: constant 1 (norm gains)
  bool init_one = false;
};

class ParamStore {
 public:
  // Declares a parameter; all declarations come before allocate().
  void declare(const std::string& name, const Shape& shape, bool decay, double init_std, bool init_one = false);
  void allocate(DType dtype, Device device = Device::CPU);
  // Fills every weight from (seed, name): a parameter's values do not depend on which others
  // exist or their order. Gradients are zeroed.
  void initialize(std::uint64_t seed);

  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  Tensor weight(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  Tensor weight(const ParamInfo& p) const;
  Tensor grad(const ParamInfo& p) const;
  Tensor& flat_weights() { return weights_; }
  Tensor& flat_grads() { return grads_; }
  const Tensor& flat_weights() const { return weights_; }
  const Tensor& flat_grads() const { return grads_; }
  std::int64_t total() const { return total_; }
  void zero_grads() { grads_.zero_(); }

 private:
  std::vector<ParamInfo> infos_;
  std::int64_t total_ = 0;
  Tensor weights_, grads_;
};

}  // namespace nsatron
