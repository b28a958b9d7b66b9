// Helpers for the checkpoint tests: a scratch directory, a small ParamStore with moments, and
// ways to damage a checkpoint (flip a byte of a dataset's data, truncate, unlink a dataset).
#pragma once
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint.h"
#include "core/util/error.h"
#include "core/model/params.h"
#include "core/model/rng.h"

namespace ckpt_test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "nsatron_ckpt_XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Parameters shaped like the model's: nested paths, dots in names, 1-D to 3-D.
struct Spec {
  std::string name;
  nsatron::Shape shape;
};
inline std::vector<Spec> small_model(std::int64_t wqkv_rows = 24) {
  return {{"model/embedding", {16, 8}},
          {"model/layers.0/attn_norm", {8}},
          {"model/layers.0/attn/wqkv", {wqkv_rows, 8}},
          {"model/layers.0/attn/cmp_wk", {2, 12, 4}},
          {"model/layers.1/mlp/w_in", {10, 8}},
          {"model/final_norm", {8}}};
}

struct Model {
  nsatron::ParamStore params;
  nsatron::Tensor m, v;
};

// Weights from ParamStore::initialize(seed); moments random (v positive), from the seed.
inline Model make_model(std::uint64_t seed, const std::vector<Spec>& specs = small_model()) {
  Model mo;
  for (const auto& s : specs) mo.params.declare(s.name, s.shape, true, 0.02);
  mo.params.allocate(nsatron::DType::F32);
  mo.params.initialize(seed);
  mo.m = nsatron::Tensor::zeros({mo.params.total()}, nsatron::DType::F32);
  mo.v = nsatron::Tensor::zeros({mo.params.total()}, nsatron::DType::F32);
  nsatron::SplitMix64 rng(seed * 7919 + 1);
  float* m = mo.m.data<float>();
  float* v = mo.v.data<float>();
  for (std::int64_t i = 0; i < mo.params.total(); ++i) {
    m[i] = float(rng.normal() * 1e-3);
    v[i] = float(rng.uniform() * 1e-6);
  }
  return mo;
}

inline nsatron::checkpoint::TrainState make_state(std::int64_t step) {
  nsatron::checkpoint::TrainState st;
  st.step = step;
  st.consumed_tokens = step * 4096;
  st.optimizer_step = step - 1;
  st.sampler_position = "nsatron-sampler/1 consumed_samples=" + std::to_string(step * 2) +
                        " seed=1234 seq_len=2048 shuffle=1 dataset_tokens=1000000 dataset_fingerprint=42";
  st.rng = "splitmix64 state=" + std::to_string(step * 31337);
  st.config_toml = "[model]\nvocab_size = 256\nd_model = 8 # \xc3\xa9t\xc3\xa9\n\n[train]\nsteps = 1000\n";
  st.extra["lr_schedule"] = "cosine";
  return st;
}

inline bool same_bits(const nsatron::Tensor& a, const nsatron::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// The byte offset in the file of a contiguous dataset's data, and its size.
inline std::pair<std::uint64_t, std::uint64_t> data_region(const fs::path& file, const std::string& dataset) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("cannot open " + file.string());
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  if (d < 0) throw std::runtime_error("no dataset " + dataset);
  const haddr_t off = H5Dget_offset(d);
  const hsize_t size = H5Dget_storage_size(d);
  H5Dclose(d);
  H5Fclose(f);
  if (off == HADDR_UNDEF) throw std::runtime_error("no contiguous storage for " + dataset);
  return {std::uint64_t(off), std::uint64_t(size)};
}

inline void xor_byte(const fs::path& file, std::uint64_t at, unsigned char mask = 0x10) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(at));
  char c = 0;
  io.read(&c, 1);
  c = char(c ^ char(mask));
  io.seekp(std::streamoff(at));
  io.write(&c, 1);
  if (!io) throw std::runtime_error("cannot flip a byte of " + file.string());
}

// Flips one byte `k` bytes into the dataset's data.
inline void flip_data_byte(const fs::path& file, const std::string& dataset, std::uint64_t k = 5) {
  const auto [off, size] = data_region(file, dataset);
  if (k >= size) throw std::runtime_error("byte out of range");
  xor_byte(file, off + k);
}

inline void unlink_dataset(const fs::path& file, const std::string& dataset) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0 || H5Ldelete(f, dataset.c_str(), H5P_DEFAULT) < 0) throw std::runtime_error("cannot delete " + dataset);
  H5Fclose(f);
}

inline std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// Runs fn, expecting a nsatron::UserError whose message contains every one of `parts`.
template <class F> std::string expect_user_error(F fn, std::vector<std::string> parts) {
  try {
    fn();
  } catch (const nsatron::UserError& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no nsatron::UserError";
  return "";
}

}  // namespace ckpt_test
