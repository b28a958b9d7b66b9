// The model's parameters: one flat buffer of weights and one of gradients, each parameter a
// named view into them. Flat buffers make the fused AdamW update, the global gradient norm,
// zeroing, and the data-parallel all-reduce one call each.
//
// Names are paths ("model/layers.3/attn/wqkv"): checkpoints store one dataset per name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor/box.h"
#include "core/tensor/tensor.h"

namespace nsatron {

// Where a parameter's local tensor sits in the full ("global") tensor. Tensor parallelism
// keeps a block of a tensor on each rank: rows (column-parallel weights, the vocabulary of the
// embedding and head, the KV groups of the compression maps) or columns (row-parallel
// weights). Each rank holds one block; checkpoints store it with its offset, so any layout
// can read it back.
struct ShardPlacement {
  Shape global_shape;   // empty: the parameter is whole (global_shape = shape, offset 0)
  Shape offset;         // index of the block's first element in the global tensor
  // Another rank holds the same values and counts them: the tensor-parallel copies of the
  // norm gains (on tp_rank > 0) and the last pipeline stage's copy of a tied embedding. A
  // replica is left out of the gradient norm and of checkpoints.
  bool replica = false;
};

struct ParamInfo {
  std::string name;
  Shape shape;          // this rank's block
  Shape global_shape;   // the full tensor (== shape when whole)
  Shape global_offset;  // the block's first index in it (zeros when whole)
  bool replica = false; // ShardPlacement::replica
  std::int64_t offset = 0;  // elements into the flat buffers
  std::int64_t numel = 0;
  bool decay = true;        // AdamW weight decay applies (not to norms or position embeddings)
  double init_std = 0.0;    // normal(0, init_std); 0 with init_one: constant 1 (norm gains)
  bool init_one = false;
};

bool is_whole(const ParamInfo& p);

class ParamStore {
 public:
  // Declares a parameter; all declarations come before allocate().
  void declare(const std::string& name, const Shape& shape, bool decay, double init_std, bool init_one = false,
               const ShardPlacement& placement = {});
  void allocate(DType dtype, Device device = Device::CPU);
  // Fills every weight from (seed, name): a parameter's values do not depend on which others
  // exist or their order, and a block is the same block of the whole tensor's values (a
  // sharded model starts from the single-process model's weights). Gradients are zeroed.
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
