#include "core/model/nsa_core_cuda.h"

#include <stdexcept>

namespace nsatron {

std::shared_ptr<void> nsa_core_forward_cuda(const nsa::NsaDims&, const LayerActivations&, const TensorByPart&, Tensor&,
                                            bool) {
  throw std::runtime_error("the NSA core on CUDA is not wired into the model yet");
}

void nsa_core_backward_cuda(const nsa::NsaDims&, const LayerActivations&, const TensorByPart&, const TensorByPart&,
                            const Tensor&, Tensor* const[8]) {
  throw std::runtime_error("the NSA core on CUDA is not wired into the model yet");
}

}  // namespace nsatron
