// `nsatron nsa-parity`: runs the NSA core on inputs read from an HDF5 file and writes the
// output, the selected blocks and all twelve gradients, so any implementation can be checked
// against this one. File format: docs/nsa.md.
#include "nsa/parity.h"

#include <hdf5.h>

#include <array>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/util/error.h"
#include "nsa/nsa.h"
#ifdef NSATRON_WITH_CUDA
#include "core/device/cuda_check.h"
#include "nsa/cuda/nsa_cuda.h"
#endif

namespace nsatron::nsa {

namespace {

constexpr const char* kUsage =
    "usage: nsatron nsa-parity --in IN.h5 --out OUT.h5 [--device cpu|cuda] [--dtype fp32|bf16]\n"
    "\n"
    "Runs the NSA attention core (forward and backward) on the inputs in IN.h5 and writes\n"
    "OUT.h5. IN.h5 holds the datasets q [B,T,H,D], k_cmp v_cmp k_slc v_slc k_win v_win\n"
    "[B,T,G,D], gate [B,T,H,3], cmp_wk cmp_wv [G,l*D,D], cmp_pk cmp_pv [G,l,D] and d_out\n"
    "[B,T,H,D], all float64 or all float32 (the computation runs in that type), and the\n"
    "root attributes cmp_block (l), cmp_stride (d), sel_block (l'), sel_count (n), window (w)\n"
    "(integers) and rope_theta (a number). OUT.h5 gets out [B,T,H,D], sel_blocks int32\n"
    "[B,T,G,n] (each row ascending, -1 padded) and grad_<name> for the twelve inputs: the\n"
    "gradients of sum(out * d_out). --device cuda runs the CUDA kernels in fp32 (default) or,\n"
    "with --dtype bf16, on the inputs rounded to bf16 with bf16 storage and fp32 math; the\n"
    "outputs are written in the input's float type. Bad input: a message and exit code 2.\n"
    "See docs/nsa.md.\n";

constexpr std::array<const char*, 12> kInputNames = {
    "q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win",
    "gate", "cmp_wk", "cmp_wv", "cmp_pk", "cmp_pv"};

// Owns one HDF5 identifier.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() {
    if (id_ >= 0) close_(id_);
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  Closer close_;
};

// Silences HDF5's own error printing while alive; we report errors ourselves.
class H5Quiet {
 public:
  H5Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << "]";
  return os.str();
}

struct DatasetInfo {
  std::vector<std::int64_t> shape;
  std::size_t elem_size = 0;  // 4 or 8
};

DatasetInfo inspect_dataset(hid_t file, const std::string& path, const std::string& name) {
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(path + ": missing dataset '" + name + "'");
  H5Handle ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) throw UserError(path + ": '" + name + "' is not a dataset");
  H5Handle type(H5Dget_type(ds.get()), H5Tclose);
  DatasetInfo info;
  info.elem_size = H5Tget_size(type.get());
  if (H5Tget_class(type.get()) != H5T_FLOAT || (info.elem_size != 4 && info.elem_size != 8))
    throw UserError(path + ": dataset '" + name +
                    "' must be float32 or float64");
  H5Handle space(H5Dget_space(ds.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw UserError(path + ": cannot read the shape of '" + name + "'");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  for (hsize_t v : dims) info.shape.push_back(std::int64_t(v));
  return info;
}

template <class Real>
std::vector<Real> read_dataset(hid_t file, const std::string& path, const std::string& name,
                               std::int64_t numel) {
  std::vector<Real> data(static_cast<std::size_t>(numel));
  H5Handle ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  const hid_t mem = sizeof(Real) == 8 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT;
  if (!ds.ok() || H5Dread(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
    throw UserError(path + ": cannot read dataset '" + name + "'");
  return data;
}

// A scalar (or one-element) numeric root attribute.
double read_attribute(hid_t file, const std::string& path, const char* name, bool integer) {
  if (H5Aexists_by_name(file, ".", name, H5P_DEFAULT) <= 0)
    throw UserError(path + ": missing root attribute '" + name + "'");
  H5Handle attr(H5Aopen_by_name(file, ".", name, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  H5Handle space(H5Aget_space(attr.get()), H5Sclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  const bool numeric = cls == H5T_INTEGER || cls == H5T_FLOAT;
  if (!numeric || (integer && cls != H5T_INTEGER))
    throw UserError(path + ": attribute '" + name + "' must be " +
                    (integer ? "an integer" : "a number"));
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    throw UserError(path + ": attribute '" + name +
                    "' must be a single value");
  if (integer) {
    std::int64_t v = 0;
    if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0)
      throw UserError(path + ": cannot read attribute '" + name + "'");
    return double(v);
  }
  double v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v) < 0)
    throw UserError(path + ": cannot read attribute '" + name + "'");
  return v;
}

void write_dataset(hid_t file, const std::string& path, const std::string& name, hid_t mem_type,
                   hid_t file_type, const std::vector<std::int64_t>& shape, const void* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Handle ds(H5Dcreate2(file, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                         H5P_DEFAULT),
              H5Dclose);
  if (!ds.ok() || H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    throw UserError(path + ": cannot write dataset '" + name + "'");
}

void write_attribute(hid_t file, const char* name, hid_t type, const void* value) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(file, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (attr.ok()) H5Awrite(attr.get(), type, value);
}

template <class Real>
void write_results(const std::string& out_path, const NsaDims& dims,
                   const std::vector<std::vector<std::int64_t>>& shapes,
                   const std::vector<Real>& out, const std::vector<std::int32_t>& sel_blocks,
                   const std::vector<std::vector<Real>>& grad) {
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, G = dims.G, D = dims.D;
  H5Handle file(H5Fcreate(out_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw UserError("cannot create output file " + out_path);
  const hid_t real_type = sizeof(Real) == 8 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT;
  const hid_t real_file_type = sizeof(Real) == 8 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE;
  write_dataset(file.get(), out_path, "out", real_type, real_file_type, {B, T, H, D}, out.data());
  write_dataset(file.get(), out_path, "sel_blocks", H5T_NATIVE_INT32, H5T_STD_I32LE,
                {B, T, G, dims.sel_count}, sel_blocks.data());
  for (std::size_t k = 0; k < kInputNames.size(); ++k)
    write_dataset(file.get(), out_path, std::string("grad_") + kInputNames[k], real_type,
                  real_file_type, shapes[k], grad[k].data());
  const std::int64_t attrs[5] = {dims.cmp_block, dims.cmp_stride, dims.sel_block, dims.sel_count,
                                 dims.window};
  const char* attr_names[5] = {"cmp_block", "cmp_stride", "sel_block", "sel_count", "window"};
  for (int k = 0; k < 5; ++k) write_attribute(file.get(), attr_names[k], H5T_NATIVE_INT64, &attrs[k]);
  write_attribute(file.get(), "rope_theta", H5T_NATIVE_DOUBLE, &dims.rope_theta);
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
    throw UserError("cannot write output file " + out_path);
}

std::vector<std::vector<std::int64_t>> input_shapes(const NsaDims& dims) {
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, G = dims.G, D = dims.D;
  const std::int64_t l = dims.cmp_block;
  return {{B, T, H, D}, {B, T, G, D}, {B, T, G, D}, {B, T, G, D}, {B, T, G, D}, {B, T, G, D},
          {B, T, G, D}, {B, T, H, 3}, {G, l * D, D}, {G, l * D, D}, {G, l, D},  {G, l, D}};
}

std::int64_t numel_of(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}

template <class Real>
int run_parity(hid_t in_file, const std::string& in_path, const std::string& out_path,
               const NsaDims& dims) {
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, D = dims.D;
  const auto shapes = input_shapes(dims);
  std::vector<std::vector<Real>> data;
  for (std::size_t k = 0; k < kInputNames.size(); ++k)
    data.push_back(read_dataset<Real>(in_file, in_path, kInputNames[k], numel_of(shapes[k])));
  const std::vector<Real> d_out = read_dataset<Real>(in_file, in_path, "d_out", B * T * H * D);

  NsaInputs<Real> in{data[0].data(), data[1].data(), data[2].data(),  data[3].data(),
                     data[4].data(), data[5].data(), data[6].data(),  data[7].data(),
                     data[8].data(), data[9].data(), data[10].data(), data[11].data()};
  std::vector<Real> out(static_cast<std::size_t>(B * T * H * D));
  NsaSaved<Real> saved;
  nsa_forward(dims, in, out.data(), &saved);
  std::vector<std::vector<Real>> grad;
  for (const auto& s : shapes) grad.emplace_back(static_cast<std::size_t>(numel_of(s)), Real(0));
  NsaGrads<Real> gr{grad[0].data(), grad[1].data(), grad[2].data(),  grad[3].data(),
                    grad[4].data(), grad[5].data(), grad[6].data(),  grad[7].data(),
                    grad[8].data(), grad[9].data(), grad[10].data(), grad[11].data()};
  nsa_backward(dims, in, saved, d_out.data(), gr);
  write_results<Real>(out_path, dims, shapes, out, saved.sel_blocks, grad);
  std::cout << "nsa-parity: " << dims.str() << ", " << (sizeof(Real) == 8 ? "float64" : "float32")
            << " on cpu: wrote " << out_path << "\n";
  return 0;
}

#ifdef NSATRON_WITH_CUDA
// Copies host values (any float type) to a new device array of T.
template <class T, class Real>
T* to_device(const std::vector<Real>& h) {
  std::vector<T> conv(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) conv[i] = T(float(h[i]));
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, std::max<std::size_t>(conv.size(), 1) * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(d, conv.data(), conv.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class Real, class T>
std::vector<Real> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<Real> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = Real(float(h[i]));
  return out;
}

// The CUDA core in T (float or bf16) on inputs read as Real; outputs written as Real.
template <class Real, class T>
int run_parity_cuda(hid_t in_file, const std::string& in_path, const std::string& out_path,
                    const NsaDims& dims, const char* dtype_name) {
  const std::int64_t B = dims.B, T_ = dims.T, H = dims.H, D = dims.D;
  const auto shapes = input_shapes(dims);
  std::vector<T*> dev_in;
  std::vector<void*> owned;
  for (std::size_t k = 0; k < kInputNames.size(); ++k) {
    dev_in.push_back(to_device<T>(read_dataset<Real>(in_file, in_path, kInputNames[k],
                                                     numel_of(shapes[k]))));
    owned.push_back(dev_in.back());
  }
  T* d_out = to_device<T>(read_dataset<Real>(in_file, in_path, "d_out", B * T_ * H * D));
  owned.push_back(d_out);
  const std::size_t out_n = static_cast<std::size_t>(B * T_ * H * D);
  T* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, out_n * sizeof(T)));
  owned.push_back(out);
  std::vector<void*> dgrad;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const std::size_t bytes = std::max<std::int64_t>(numel_of(shapes[k]), 1) * (k >= 8 ? 4 : sizeof(T));
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    CUDA_CHECK(cudaMemset(p, 0, bytes));  // parameter gradients start from zero
    dgrad.push_back(p);
    owned.push_back(p);
  }
  std::vector<Real> out_h;
  std::vector<std::int32_t> sel_h;
  std::vector<std::vector<Real>> grad;
  try {
    const NsaInputs<T> in{dev_in[0], dev_in[1], dev_in[2], dev_in[3], dev_in[4],  dev_in[5],
                          dev_in[6], dev_in[7], dev_in[8], dev_in[9], dev_in[10], dev_in[11]};
    cuda::NsaSavedCuda saved;
    cuda::nsa_forward<T>(dims, in, out, &saved);
    cuda::NsaGradsCuda<T> gr;
    gr.q = static_cast<T*>(dgrad[0]);
    gr.k_cmp = static_cast<T*>(dgrad[1]);
    gr.v_cmp = static_cast<T*>(dgrad[2]);
    gr.k_slc = static_cast<T*>(dgrad[3]);
    gr.v_slc = static_cast<T*>(dgrad[4]);
    gr.k_win = static_cast<T*>(dgrad[5]);
    gr.v_win = static_cast<T*>(dgrad[6]);
    gr.gate = static_cast<T*>(dgrad[7]);
    gr.cmp_wk = static_cast<float*>(dgrad[8]);
    gr.cmp_wv = static_cast<float*>(dgrad[9]);
    gr.cmp_pk = static_cast<float*>(dgrad[10]);
    gr.cmp_pv = static_cast<float*>(dgrad[11]);
    cuda::nsa_backward<T>(dims, in, saved, d_out, gr);
    CUDA_CHECK(cudaDeviceSynchronize());
    out_h = to_host<Real>(out, out_n);
    sel_h = saved.sel_blocks_host();
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const std::size_t n = static_cast<std::size_t>(numel_of(shapes[k]));
      grad.push_back(k >= 8 ? to_host<Real>(static_cast<const float*>(dgrad[k]), n)
                            : to_host<Real>(static_cast<const T*>(dgrad[k]), n));
    }
  } catch (...) {
    for (void* p : owned) cudaFree(p);
    throw;
  }
  for (void* p : owned) cudaFree(p);
  write_results<Real>(out_path, dims, shapes, out_h, sel_h, grad);
  std::cout << "nsa-parity: " << dims.str() << ", " << dtype_name << " on cuda ("
            << cuda_device_summary() << "): wrote " << out_path << "\n";
  return 0;
}
#endif
}  // namespace

int parity_main(const std::vector<std::string>& args) {
  std::string in_path, out_path, device = "cpu", dtype;
  for (std::size_t k = 0; k < args.size(); ++k) {
    const std::string& a = args[k];
    auto value = [&]() -> std::string {
      if (k + 1 >= args.size()) throw UserError(a + " needs a value\n" + kUsage);
      return args[++k];
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--in") {
      in_path = value();
    } else if (a == "--out") {
      out_path = value();
    } else if (a == "--device") {
      device = value();
    } else if (a == "--dtype") {
      dtype = value();
    } else {
      throw UserError("unknown argument '" + a + "'\n" + kUsage);
    }
  }
  if (in_path.empty() || out_path.empty())
    throw UserError(std::string("--in and --out are required\n") + kUsage);
  if (device != "cpu" && device != "cuda")
    throw UserError("--device must be cpu or cuda, not '" + device + "'");
  if (!dtype.empty() && device != "cuda")
    throw UserError("--dtype applies to --device cuda only (the CPU computes in the input's type)");
  if (dtype.empty()) dtype = "fp32";
  if (dtype != "fp32" && dtype != "bf16")
    throw UserError("--dtype must be fp32 or bf16, not '" + dtype + "'");
#ifndef NSATRON_WITH_CUDA
  if (device == "cuda")
    throw UserError(
        "--device cuda is not available: this build has no CUDA (configure with NSATRON_CUDA=ON)");
#endif

  H5Quiet quiet;
  if (H5Fis_hdf5(in_path.c_str()) <= 0)
    throw UserError(in_path + " does not exist or is not an HDF5 file");
  H5Handle file(H5Fopen(in_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw UserError("cannot open " + in_path);

  NsaDims dims;
  dims.cmp_block = std::int64_t(read_attribute(file.get(), in_path, "cmp_block", true));
  dims.cmp_stride = std::int64_t(read_attribute(file.get(), in_path, "cmp_stride", true));
  dims.sel_block = std::int64_t(read_attribute(file.get(), in_path, "sel_block", true));
  dims.sel_count = std::int64_t(read_attribute(file.get(), in_path, "sel_count", true));
  dims.window = std::int64_t(read_attribute(file.get(), in_path, "window", true));
  dims.rope_theta = read_attribute(file.get(), in_path, "rope_theta", false);

  // Shapes: B, T, H, D from q; G from k_cmp; everything else must agree.
  std::vector<DatasetInfo> info;
  for (const char* name : kInputNames) info.push_back(inspect_dataset(file.get(), in_path, name));
  const DatasetInfo d_out_info = inspect_dataset(file.get(), in_path, "d_out");
  const auto& qs = info[0].shape;
  if (qs.size() != 4)
    throw UserError(in_path + ": dataset 'q' has shape " + shape_text(qs) +
                    ", expected 4 dimensions [B,T,H,D]");
  if (info[1].shape.size() != 4)
    throw UserError(in_path + ": dataset 'k_cmp' has shape " +
                    shape_text(info[1].shape) + ", expected 4 dimensions [B,T,G,D]");
  dims.B = qs[0];
  dims.T = qs[1];
  dims.H = qs[2];
  dims.D = qs[3];
  dims.G = info[1].shape[2];
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, G = dims.G, D = dims.D;
  const std::int64_t l = dims.cmp_block;
  const std::vector<std::pair<std::vector<std::int64_t>, const char*>> expected = {
      {{B, T, H, D}, "[B,T,H,D]"},  {{B, T, G, D}, "[B,T,G,D]"}, {{B, T, G, D}, "[B,T,G,D]"},
      {{B, T, G, D}, "[B,T,G,D]"},  {{B, T, G, D}, "[B,T,G,D]"}, {{B, T, G, D}, "[B,T,G,D]"},
      {{B, T, G, D}, "[B,T,G,D]"},  {{B, T, H, 3}, "[B,T,H,3]"}, {{G, l * D, D}, "[G,l*D,D]"},
      {{G, l * D, D}, "[G,l*D,D]"}, {{G, l, D}, "[G,l,D]"},      {{G, l, D}, "[G,l,D]"}};
  auto check_shape = [&](const std::string& name, const std::vector<std::int64_t>& got,
                         const std::vector<std::int64_t>& want, const char* formula) {
    if (got != want)
      throw UserError(in_path + ": dataset '" + name + "' has shape " +
                      shape_text(got) + ", expected " + formula + " = " + shape_text(want) +
                      " (B,T,H,D from q, G from k_cmp, l from the attribute cmp_block)");
  };
  for (std::size_t k = 0; k < kInputNames.size(); ++k)
    check_shape(kInputNames[k], info[k].shape, expected[k].first, expected[k].second);
  check_shape("d_out", d_out_info.shape, {B, T, H, D}, "[B,T,H,D]");
  for (std::size_t k = 1; k < info.size(); ++k)
    if (info[k].elem_size != info[0].elem_size)
      throw UserError(in_path + ": mixed dtypes: 'q' is float" +
                      std::to_string(8 * info[0].elem_size) + " but '" + kInputNames[k] +
                      "' is float" + std::to_string(8 * info[k].elem_size) +
                      " (all datasets must be float64 or all float32)");
  if (d_out_info.elem_size != info[0].elem_size)
    throw UserError(in_path + ": mixed dtypes: 'q' is float" +
                    std::to_string(8 * info[0].elem_size) + " but 'd_out' is float" +
                    std::to_string(8 * d_out_info.elem_size));
  dims.validate();

#ifdef NSATRON_WITH_CUDA
  if (device == "cuda") {
    if (!cuda_available())
      throw UserError("--device cuda is not available: " + cuda_device_summary());
    const bool f64 = info[0].elem_size == 8;
    if (dtype == "bf16")
      return f64 ? run_parity_cuda<double, cuda::bf16>(file.get(), in_path, out_path, dims, "bf16")
                 : run_parity_cuda<float, cuda::bf16>(file.get(), in_path, out_path, dims, "bf16");
    return f64 ? run_parity_cuda<double, float>(file.get(), in_path, out_path, dims, "fp32")
               : run_parity_cuda<float, float>(file.get(), in_path, out_path, dims, "fp32");
  }
#endif
  if (info[0].elem_size == 8) return run_parity<double>(file.get(), in_path, out_path, dims);
  return run_parity<float>(file.get(), in_path, out_path, dims);
}

}  // namespace nsatron::nsa
