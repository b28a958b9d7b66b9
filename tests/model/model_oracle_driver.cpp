// Driver for tests/model/oracle_model.py: builds an NsaTransformer in fp64, runs one
// forward_backward on a random batch, and writes everything the oracle needs to HDF5.
//
//   model_oracle_driver OUT.h5 key=value ...
//
// Keys (all required unless a default is given):
//   V C L H G D F cmp_block cmp_stride sel_block sel_count window    integers
//   rope_theta norm_eps init_std                                     reals
//   tie (0/1)  seed  B  T
//   random_sd (default 0: the model's own init; else every weight ~ normal(0, sd), norm gains
//              1 + normal(0, sd))
//   head_chunk (default 1024)   policy (none | selective | full; default none)
//   recompute_layers (default L)   attention (nsa | dense; default nsa)
//
// OUT.h5: datasets tokens, targets ([B, T] int32); weights/<name> and grads/<name> (fp64,
// the parameter's shape; names are paths such as model/layers.0/attn/wqkv); last_logits
// ([B, V], last_logits() of the batch's tokens); attributes
// loss (forward_backward's mean loss), loss_eval (evaluate()'s), names (the parameter names
// in declaration order, one per line).
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/model/rng.h"

namespace {

using namespace nsatron;

hid_t h5(hid_t id, const std::string& what) {
  if (id < 0) throw std::runtime_error("HDF5: " + what);
  return id;
}

void write_dataset(hid_t file, const std::string& name, hid_t mem_type, hid_t file_type, const void* data,
                   const std::vector<hsize_t>& dims) {
  hid_t lcpl = h5(H5Pcreate(H5P_LINK_CREATE), "lcpl");
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t sp = h5(H5Screate_simple(int(dims.size()), dims.data(), nullptr), "space " + name);
  hid_t ds = h5(H5Dcreate2(file, name.c_str(), file_type, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT), "create " + name);
  if (H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) throw std::runtime_error("HDF5: write " + name);
  H5Dclose(ds);
  H5Sclose(sp);
  H5Pclose(lcpl);
}

void write_tensor(hid_t file, const std::string& name, const Tensor& t) {
  const std::vector<double> v = t.to_vector();
  write_dataset(file, name, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, v.data(),
                std::vector<hsize_t>(t.shape().begin(), t.shape().end()));
}

void write_double_attr(hid_t file, const char* name, double v) {
  hid_t sp = h5(H5Screate(H5S_SCALAR), "scalar space");
  hid_t at = h5(H5Acreate2(file, name, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT), name);
  H5Awrite(at, H5T_NATIVE_DOUBLE, &v);
  H5Aclose(at);
  H5Sclose(sp);
}

void write_string_attr(hid_t file, const char* name, const std::string& s) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, s.size() + 1);
  hid_t sp = h5(H5Screate(H5S_SCALAR), "scalar space");
  hid_t at = h5(H5Acreate2(file, name, type, sp, H5P_DEFAULT, H5P_DEFAULT), name);
  H5Awrite(at, type, s.c_str());
  H5Aclose(at);
  H5Sclose(sp);
  H5Tclose(type);
}

int run(int argc, char** argv) {
  if (argc < 2) throw std::invalid_argument("usage: model_oracle_driver OUT.h5 key=value ...");
  std::map<std::string, std::string> kv;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("expected key=value, got " + a);
    kv[a.substr(0, eq)] = a.substr(eq + 1);
  }
  auto take = [&](const std::string& k, const char* dflt = nullptr) -> std::string {
    auto it = kv.find(k);
    if (it == kv.end()) {
      if (!dflt) throw std::invalid_argument("missing key " + k);
      return dflt;
    }
    std::string v = it->second;
    kv.erase(it);
    return v;
  };
  auto i64 = [&](const std::string& k, const char* dflt = nullptr) { return std::stoll(take(k, dflt)); };
  auto f64 = [&](const std::string& k, const char* dflt = nullptr) { return std::stod(take(k, dflt)); };

  ModelDims d{};
  d.V = i64("V"), d.C = i64("C"), d.L = i64("L"), d.H = i64("H"), d.G = i64("G"), d.D = i64("D"), d.F = i64("F");
  d.cmp_block = i64("cmp_block"), d.cmp_stride = i64("cmp_stride"), d.sel_block = i64("sel_block");
  d.sel_count = i64("sel_count"), d.window = i64("window");
  d.rope_theta = f64("rope_theta"), d.norm_eps = f64("norm_eps"), d.init_std = f64("init_std");
  d.tie_embeddings = i64("tie") != 0;
  d.attention = parse_attention(take("attention", "nsa"));
  const std::uint64_t seed = std::uint64_t(std::stoull(take("seed")));
  const std::int64_t B = i64("B"), T = i64("T");
  const double random_sd = f64("random_sd", "0");
  const std::int64_t head_chunk = i64("head_chunk", "1024");
  const RecomputePolicy policy = parse_recompute_policy(take("policy", "none"));
  const std::int64_t rlayers = i64("recompute_layers", std::to_string(d.L).c_str());
  if (!kv.empty()) throw std::invalid_argument("unknown key " + kv.begin()->first);

  NsaTransformer model(d, DType::F64);
  model.params().initialize(seed);
  SplitMix64 rng(stream_seed(seed, "oracle/driver"));
  if (random_sd > 0) {
    std::vector<double> w(std::size_t(model.params().total()));
    for (const auto& p : model.params().infos())
      for (std::int64_t i = 0; i < p.numel; ++i)
        w[std::size_t(p.offset + i)] = (p.init_one ? 1.0 : 0.0) + random_sd * rng.normal();
    model.params().flat_weights().copy_from(Tensor::from_vector(w, {model.params().total()}, DType::F64));
  }
  std::vector<std::int32_t> tokens(std::size_t(B * T)), targets(std::size_t(B * T));
  for (auto& t : tokens) t = std::int32_t(rng.next() % std::uint64_t(d.V));
  for (auto& t : targets) t = std::int32_t(rng.next() % std::uint64_t(d.V));

  model.set_head_chunk(head_chunk);
  model.set_recompute(policy, rlayers);
  model.params().zero_grads();
  const double loss = model.forward_backward(tokens, targets, B, T);
  const double loss_eval = model.evaluate(tokens, targets, B, T);
  const Tensor last_logits = model.last_logits(tokens, B, T);

  hid_t file = h5(H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), std::string("create ") + argv[1]);
  const std::vector<hsize_t> bt = {hsize_t(B), hsize_t(T)};
  write_dataset(file, "tokens", H5T_NATIVE_INT32, H5T_STD_I32LE, tokens.data(), bt);
  write_dataset(file, "targets", H5T_NATIVE_INT32, H5T_STD_I32LE, targets.data(), bt);
  write_tensor(file, "last_logits", last_logits);
  std::string names;
  for (const auto& p : model.params().infos()) {
    write_tensor(file, "weights/" + p.name, model.params().weight(p));
    write_tensor(file, "grads/" + p.name, model.params().grad(p));
    names += p.name + "\n";
  }
  write_double_attr(file, "loss", loss);
  write_double_attr(file, "loss_eval", loss_eval);
  write_string_attr(file, "names", names);
  H5Fclose(file);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_oracle_driver: %s\n", e.what());
    return 1;
  }
}
