#include "core/model/params.h"

#include <stdexcept>

#include "core/model/rng.h"

namespace nsatron {

void ParamStore::declare(const std::string& name, const Shape& shape, bool decay, double init_std, bool init_one) {
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
  total_ += p.numel;
  infos_.push_back(p);
}

void ParamStore::allocate(DType dtype, Device device) {
  weights_ = Tensor::zeros({total_}, dtype, device);
  grads_ = Tensor::zeros({total_}, dtype, device);
}

void ParamStore::initialize(std::uint64_t seed) {
  std::vector<double> values(static_cast<std::size_t>(total_));
  for (const auto& p : infos_) {
    SplitMix64 rng(stream_seed(seed, p.name));
    for (std::int64_t i = 0; i < p.numel; ++i)
      values[std::size_t(p.offset + i)] = p.init_one ? 1.0 : p.init_std * rng.normal();
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
