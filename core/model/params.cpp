#include "core/model/params.h"

#include <stdexcept>

#include "core/model/rng.h"

namespace nsatron {

bool is_whole(const ParamInfo& p) { return p.global_shape == p.shape; }

void ParamStore::declare(const std::string& name, const Shape& shape, bool decay, double init_std, bool init_one,
                         const ShardPlacement& placement) {
  if (weights_.defined()) throw std::logic_error("ParamStore::declare after allocate: " + name);
  for (const auto& p : infos_)
    if (p.name == name) throw std::logic_error("parameter declared twice: " + name);
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.offset = total_;
  p.numel = shape_numel(shape);
  p.decay = decay;
  p.init_std = init_std;
  p.init_one = init_one;
  p.global_shape = placement.global_shape.empty() ? shape : placement.global_shape;
  p.global_offset = placement.offset.empty() ? Shape(shape.size(), 0) : placement.offset;
  p.replica = placement.replica;
  if (p.global_shape.size() != shape.size() || p.global_offset.size() != shape.size())
    throw std::logic_error("parameter " + name + ": block and global tensor differ in rank");
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (p.global_offset[d] < 0 || p.global_offset[d] + shape[d] > p.global_shape[d])
      throw std::logic_error("parameter " + name + ": block " + shape_str(shape) + " at offset " +
                             shape_str(p.global_offset) + " outside " + shape_str(p.global_shape));
  total_ += p.numel;
  infos_.push_back(p);
}

void ParamStore::allocate(DType dtype, Device device) {
  weights_ = Tensor::zeros({total_}, dtype, device);
  grads_ = Tensor::zeros({total_}, dtype, device);
}

void ParamStore::initialize(std::uint64_t seed) {
  std::vector<double> values(static_cast<std::size_t>(total_));
  std::vector<double> whole;
  for (const auto& p : infos_) {
    // The whole tensor's values, in order; a block takes its part of them.
    const std::int64_t n = shape_numel(p.global_shape);
    double* at = values.data() + p.offset;
    double* dst = is_whole(p) ? at : (whole.resize(std::size_t(n)), whole.data());
    SplitMix64 rng(stream_seed(seed, p.name));
    for (std::int64_t i = 0; i < n; ++i) dst[i] = p.init_one ? 1.0 : p.init_std * rng.normal();
    if (!is_whole(p)) extract_box(whole.data(), p.global_shape, p.global_offset, p.shape, at);
  }
  Tensor host = Tensor::from_vector(values, {total_}, weights_.dtype());
  weights_.copy_from(host);
  grads_.zero_();
}

const ParamInfo& ParamStore::info(const std::string& name) const {
  for (const auto& p : infos_)
    if (p.name == name) return p;
  throw std::out_of_range("no parameter named " + name);
}

Tensor ParamStore::weight(const ParamInfo& p) const { return weights_.slice0(p.offset, p.offset + p.numel).view(p.shape); }
Tensor ParamStore::grad(const ParamInfo& p) const { return grads_.slice0(p.offset, p.offset + p.numel).view(p.shape); }
Tensor ParamStore::weight(const std::string& name) const { return weight(info(name)); }
Tensor ParamStore::grad(const std::string& name) const { return grad(info(name)); }

}  // namespace nsatron
