// Driver for tests/ops/oracle_ops.py: reads cases from an HDF5 file, runs the op families in
// fp64 (forward and backward), writes the results to a second HDF5 file.
//
//   ops_oracle_driver IN.h5 OUT.h5
//
// Each top-level group of IN is one case named "<op>__<k>"; its datasets are the inputs
// (fp64 arrays, int32 ids, one-element fp64 scalars). OUT gets a group of the same name
// holding the outputs. See oracle_ops.py for the names each op reads and writes.
#include <hdf5.h>

#include <cstdio>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/ops/adamw.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/grad_norm.h"
#include "core/ops/linear.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/swiglu.h"

namespace {

using nsatron::DType;
using nsatron::Shape;
using nsatron::Tensor;

void h5check(herr_t status, const std::string& what) {
  if (status < 0) throw std::runtime_error("HDF5: " + what);
}
hid_t h5id(hid_t id, const std::string& what) {
  if (id < 0) throw std::runtime_error("HDF5: " + what);
  return id;
}

class Group {
 public:
  Group(hid_t id, std::string name) : id_(id), name_(std::move(name)) {}
  ~Group() { H5Gclose(id_); }
  Group(const Group&) = delete;

  bool has(const std::string& key) const { return H5Lexists(id_, key.c_str(), H5P_DEFAULT) > 0; }

  Shape shape(const std::string& key) const {
    hid_t ds = h5id(H5Dopen2(id_, key.c_str(), H5P_DEFAULT), name_ + "/" + key);
    hid_t sp = H5Dget_space(ds);
    const int nd = H5Sget_simple_extent_ndims(sp);
    std::vector<hsize_t> dims(std::size_t(nd > 0 ? nd : 0));
    if (nd > 0) H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
    H5Sclose(sp);
    H5Dclose(ds);
    return Shape(dims.begin(), dims.end());
  }
  template <class T> std::vector<T> read(const std::string& key, hid_t type) const {
    const std::int64_t n = nsatron::shape_numel(shape(key));
    std::vector<T> out(static_cast<std::size_t>(n));
    hid_t ds = h5id(H5Dopen2(id_, key.c_str(), H5P_DEFAULT), name_ + "/" + key);
    if (n > 0) h5check(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), "read " + key);
    H5Dclose(ds);
    return out;
  }
  Tensor tensor(const std::string& key) const {
    return Tensor::from_vector(read<double>(key, H5T_NATIVE_DOUBLE), shape(key), DType::F64);
  }
  std::vector<std::int32_t> ids(const std::string& key) const {
    return read<std::int32_t>(key, H5T_NATIVE_INT32);
  }
  double scalar(const std::string& key) const { return read<double>(key, H5T_NATIVE_DOUBLE).at(0); }

  void write(const std::string& key, const Tensor& t) const {
    std::vector<double> v = t.to_vector();
    std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
    hid_t sp = h5id(H5Screate_simple(int(dims.size()), dims.data(), nullptr), "space");
    hid_t ds = h5id(H5Dcreate2(id_, key.c_str(), H5T_NATIVE_DOUBLE, sp, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT),
                    "create " + key);
    if (!v.empty())
      h5check(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), key);
    H5Dclose(ds);
    H5Sclose(sp);
  }

 private:
  hid_t id_;
  std::string name_;
};

Tensor like(const Tensor& t) { return Tensor::empty(t.shape(), DType::F64); }
Tensor scalar_tensor() { return Tensor::empty({1}, DType::F64); }

using Op = std::function<void(const Group& in, const Group& out)>;

const std::map<std::string, Op>& ops() {
  static const std::map<std::string, Op> table = {
      {"rmsnorm",
       [](const Group& in, const Group& out) {
         Tensor x = in.tensor("x"), w = in.tensor("w"), dy = in.tensor("dy"), dw = in.tensor("dw0");
         Tensor y = like(x), rstd = Tensor::empty({x.numel() / w.numel()}, DType::F64), dx = like(x);
         nsatron::rmsnorm_forward(x, w, y, rstd, in.scalar("eps"));
         nsatron::rmsnorm_backward(dy, x, w, rstd, dx, dw);
         out.write("y", y), out.write("rstd", rstd), out.write("dx", dx), out.write("dw", dw);
       }},
      {"add_rmsnorm",
       [](const Group& in, const Group& out) {
         Tensor a = in.tensor("a"), b = in.tensor("b"), w = in.tensor("w");
         Tensor dy = in.tensor("dy"), dh = in.tensor("dh"), dw = in.tensor("dw0");
         Tensor h = like(a), y = like(a), rstd = Tensor::empty({a.numel() / w.numel()}, DType::F64);
         nsatron::add_rmsnorm_forward(a, b, w, h, y, rstd, in.scalar("eps"));
         Tensor dx = like(a);
         nsatron::rmsnorm_backward(dy, h, w, rstd, dx, dw, &dh);
         out.write("h", h), out.write("y", y), out.write("da", dx), out.write("db", dx);
         out.write("dw", dw);
       }},
      {"swiglu_fused",
       [](const Group& in, const Group& out) {
         Tensor u = in.tensor("u"), dout = in.tensor("dout");
         Tensor o = like(dout), du = like(u);
         nsatron::swiglu_forward(u, o);
         nsatron::swiglu_backward(dout, u, du);
         out.write("out", o), out.write("du", du);
       }},
      {"swiglu_split",
       [](const Group& in, const Group& out) {
         Tensor a = in.tensor("a"), b = in.tensor("b"), dout = in.tensor("dout");
         Tensor o = like(a), da = like(a), db = like(a);
         nsatron::swiglu_forward(a, b, o);
         nsatron::swiglu_backward(dout, a, b, da, db);
         out.write("out", o), out.write("da", da), out.write("db", db);
       }},
      {"embedding",
       [](const Group& in, const Group& out) {
         Tensor table = in.tensor("table"), dout = in.tensor("dout"), dt = in.tensor("dtable0");
         auto tokens = in.ids("tokens");
         Tensor o = like(dout);
         nsatron::embedding_forward(tokens, table, o);
         nsatron::embedding_backward(tokens, dout, dt);
         out.write("out", o), out.write("dtable", dt);
       }},
      {"cross_entropy",
       [](const Group& in, const Group& out) {
         Tensor z = in.tensor("logits");
         auto t = in.ids("targets");
         const nsatron::CrossEntropyOptions opt{.ignore_index = std::int32_t(in.scalar("ignore_index"))};
         const double dloss = in.scalar("dloss");
         Tensor loss = scalar_tensor(), lse = Tensor::empty({std::int64_t(t.size())}, DType::F64);
         Tensor dz = like(z);
         nsatron::cross_entropy_forward(z, t, loss, lse, opt);
         nsatron::cross_entropy_backward(z, t, lse, dloss, dz, opt);
         Tensor zf = z.clone(), lossf = scalar_tensor();
         nsatron::cross_entropy_fused(zf, t, lossf, dloss, opt);
         out.write("loss", loss), out.write("lse", lse), out.write("dlogits", dz);
         out.write("loss_fused", lossf), out.write("dlogits_fused", zf);
       }},
      {"linear",
       [](const Group& in, const Group& out) {
         Tensor x = in.tensor("x"), w = in.tensor("w"), dy = in.tensor("dy"), dw = in.tensor("dw0");
         const bool has_b = in.has("b");
         Tensor b = has_b ? in.tensor("b") : Tensor(), db = has_b ? in.tensor("db0") : Tensor();
         Tensor y = like(dy), dx = like(x);
         nsatron::linear_forward(x, w, has_b ? &b : nullptr, y);
         nsatron::linear_backward(dy, x, w, {.dx = &dx, .dw = &dw, .dbias = has_b ? &db : nullptr});
         out.write("y", y), out.write("dx", dx), out.write("dw", dw);
         if (has_b) out.write("db", db);
       }},
      {"adamw",
       [](const Group& in, const Group& out) {
         Tensor p = in.tensor("param0"), grads = in.tensor("grads");
         const std::int64_t n = p.numel(), steps = grads.dim(0);
         Tensor m = Tensor::zeros({n}, DType::F64), v = Tensor::zeros({n}, DType::F64);
         auto off = in.ids("seg_offset"), num = in.ids("seg_numel"), dec = in.ids("seg_decay");
         std::vector<nsatron::ParamSegment> segs;
         for (std::size_t i = 0; i < off.size(); ++i) segs.push_back({off[i], num[i], dec[i] != 0});
         const nsatron::AdamWHyper hp{.lr = in.scalar("lr"), .beta1 = in.scalar("beta1"),
                                      .beta2 = in.scalar("beta2"), .eps = in.scalar("eps"),
                                      .weight_decay = in.scalar("weight_decay")};
         for (std::int64_t s = 0; s < steps; ++s) {
           Tensor g = grads.slice0(s, s + 1).view({n});
           nsatron::adamw_step(p, g, m, v, segs, hp, s + 1, in.scalar("grad_scale"));
         }
         out.write("param", p), out.write("m", m), out.write("v", v);
       }},
      {"grad_norm",
       [](const Group& in, const Group& out) {
         std::vector<Tensor> bufs;
         for (int i = 0; in.has("buf" + std::to_string(i)); ++i) bufs.push_back(in.tensor("buf" + std::to_string(i)));
         Tensor norm = scalar_tensor();
         nsatron::global_norm(bufs, norm);
         nsatron::clip_by_global_norm_(bufs, norm, in.scalar("max_norm"));
         out.write("norm", norm);
         for (std::size_t i = 0; i < bufs.size(); ++i) out.write("buf" + std::to_string(i), bufs[i]);
       }},
      {"add",
       [](const Group& in, const Group& out) {
         Tensor a = in.tensor("a"), b = in.tensor("b"), o = like(a);
         nsatron::add(a, b, o);
         out.write("out", o);
       }},
      {"split_columns",  // forward: the parts; backward: the parts' gradients joined
       [](const Group& in, const Group& out) {
         Tensor x = in.tensor("x");
         std::vector<Tensor> parts, grads;
         for (int i = 0; in.has("dpart" + std::to_string(i)); ++i) {
           grads.push_back(in.tensor("dpart" + std::to_string(i)));
           parts.push_back(like(grads.back()));
         }
         std::vector<Tensor*> pp;
         std::vector<const Tensor*> gp;
         for (std::size_t i = 0; i < parts.size(); ++i) {
           pp.push_back(&parts[i]);
           gp.push_back(&grads[i]);
         }
         nsatron::split_columns(x, pp);
         Tensor dx = like(x);
         nsatron::join_columns(gp, dx);
         for (std::size_t i = 0; i < parts.size(); ++i) out.write("part" + std::to_string(i), parts[i]);
         out.write("dx", dx);
       }},
  };
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN.h5 OUT.h5\n", argv[0]);
    return 2;
  }
  try {
    hid_t fin = h5id(H5Fopen(argv[1], H5F_ACC_RDONLY, H5P_DEFAULT), std::string("open ") + argv[1]);
    hid_t fout = h5id(H5Fcreate(argv[2], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                      std::string("create ") + argv[2]);
    H5G_info_t info;
    h5check(H5Gget_info(fin, &info), "group info");
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      char name[256];
      h5check(H5Lget_name_by_idx(fin, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name,
                                 H5P_DEFAULT) > 0 ? 0 : -1,
              "link name");
      const std::string case_name = name;
      const std::string op = case_name.substr(0, case_name.find("__"));
      auto it = ops().find(op);
      if (it == ops().end()) throw std::runtime_error("unknown op in case " + case_name);
      Group in(h5id(H5Gopen2(fin, name, H5P_DEFAULT), case_name), case_name);
      Group out(h5id(H5Gcreate2(fout, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), case_name),
                case_name);
      it->second(in, out);
    }
    H5Fclose(fout);
    H5Fclose(fin);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ops_oracle_driver: %s\n", e.what());
    return 1;
  }
  return 0;
}
