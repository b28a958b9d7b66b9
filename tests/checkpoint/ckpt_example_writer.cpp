// Writes a small checkpoint whose values a script can predict, for the h5py layout test:
//   ckpt_example_writer DIR      -> DIR/step_00000100/rank_00000.h5, DIR/latest
// Weights: w[i] = (i % 97) / 8 - 6 over the flat buffer; m[i] = i / 1024; v[i] = i % 7
// (all exact in fp32). Parameters as in tests/checkpoint/ckpt_test_util.h small_model().
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "ckpt_test_util.h"
#include "core/config/config.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: ckpt_example_writer DIR\n";
    return 2;
  }
  ckpt_test::Model mo;
  for (const auto& s : ckpt_test::small_model()) mo.params.declare(s.name, s.shape, true, 0.02);
  mo.params.allocate(nsatron::DType::F32);
  mo.m = nsatron::Tensor::zeros({mo.params.total()}, nsatron::DType::F32);
  mo.v = nsatron::Tensor::zeros({mo.params.total()}, nsatron::DType::F32);
  float* w = mo.params.flat_weights().data<float>();
  for (std::int64_t i = 0; i < mo.params.total(); ++i) {
    w[i] = float(i % 97) / 8.0f - 6.0f;
    mo.m.data<float>()[i] = float(i) / 1024.0f;
    mo.v.data<float>()[i] = float(i % 7);
  }
  nsatron::checkpoint::TrainState st = ckpt_test::make_state(100);
  st.config_toml = nsatron::to_toml(nsatron::RunConfig{});
  const auto dir = nsatron::checkpoint::save_checkpoint(argv[1], mo.params, mo.m, mo.v, st, 0);
  std::cout << dir.string() << "\n";
  return 0;
}
