// CPU benchmark of the NSA attention core (nsa/nsa.h): forward and backward wall time.
//
//   nsa_cpu_bench [--T 1024,4096,16384] [--dtype fp32|fp64] [--reps R] [--B 1] [--H 12] [--G 2]
//                 [--D 64] [--l 32] [--d 16] [--lsel 64] [--n 16] [--w 512]
//
// Defaults are the issue-3 configuration (B=1, H=12, G=2, D=64, 32/16/64/16/512). Each
// timing is the median of R runs after one untimed warm-up run; the thread count is
// OpenMP's default (set OMP_NUM_THREADS to change it; results do not depend on it).
// Results are recorded in docs/performance.md.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "nsa/nsa.h"

using namespace nsatron::nsa;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// (query head, key) pairs attended in the forward, summed over the three branches.
double attended_pairs(const NsaDims& d) {
  double pairs = 0;
  const std::int64_t N = d.num_cmp_blocks();
  for (std::int64_t t = 0; t < d.T; ++t) {
    const std::int64_t vis = t < d.cmp_block - 1 ? 0 : std::min(N, (t - d.cmp_block + 1) / d.cmp_stride + 1);
    const std::int64_t b_t = t / d.sel_block;
    const std::int64_t blocks = std::min(d.sel_count, b_t + 1);
    // Selected tokens: the query's own block is partial, the others full.
    const std::int64_t slc = (blocks - 1) * d.sel_block + (t - b_t * d.sel_block + 1);
    const std::int64_t win = std::min(d.window, t + 1);
    pairs += double(vis + slc + win);
  }
  return pairs * double(d.B * d.H);
}

template <class Real>
void run(const NsaDims& dims, int reps) {
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto make = [&](std::int64_t n, double sd) {
    std::vector<Real> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = Real(sd * normal(rng));
    return v;
  };
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, G = dims.G, D = dims.D, l = dims.cmp_block;
  const double wsd = 1.0 / std::sqrt(double(l * D));
  std::vector<std::vector<Real>> x = {make(B * T * H * D, 1),   make(B * T * G * D, 1),
                                      make(B * T * G * D, 1),   make(B * T * G * D, 1),
                                      make(B * T * G * D, 1),   make(B * T * G * D, 1),
                                      make(B * T * G * D, 1),   make(B * T * H * 3, 1),
                                      make(G * l * D * D, wsd), make(G * l * D * D, wsd),
                                      make(G * l * D, 1),       make(G * l * D, 1)};
  const std::vector<Real> d_out = make(B * T * H * D, 1);
  std::vector<std::vector<Real>> g;
  for (const auto& v : x) g.emplace_back(v.size(), Real(0));
  const NsaInputs<Real> in{x[0].data(), x[1].data(), x[2].data(), x[3].data(),  x[4].data(),  x[5].data(),
                           x[6].data(), x[7].data(), x[8].data(), x[9].data(), x[10].data(), x[11].data()};
  const NsaGrads<Real> gr{g[0].data(), g[1].data(), g[2].data(), g[3].data(),  g[4].data(),  g[5].data(),
                          g[6].data(), g[7].data(), g[8].data(), g[9].data(), g[10].data(), g[11].data()};
  std::vector<Real> out(static_cast<std::size_t>(B * T * H * D));
  NsaSaved<Real> saved;
  std::vector<double> fwd, bwd;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = now_s();
    nsa_forward(dims, in, out.data(), &saved);
    const double t1 = now_s();
    nsa_backward(dims, in, saved, d_out.data(), gr);
    const double t2 = now_s();
    if (r > 0) {  // run 0 warms up
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
    }
  }
  const double pairs = attended_pairs(dims);
  const double f = median(fwd), b = median(bwd);
  std::printf("| %6lld | %s | %2d | %9.1f | %9.1f | %9.1f | %7.1f | %7.1f | %8.1f |\n", (long long)T,
              sizeof(Real) == 4 ? "fp32" : "fp64", omp_get_max_threads(), f * 1e3, b * 1e3,
              (f + b) * 1e3, pairs / f * 1e-6, pairs / b * 1e-6,
              double(saved.bytes()) / (1 << 20));
  std::fflush(stdout);
}

std::vector<std::int64_t> parse_list(const std::string& s) {
  std::vector<std::int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  NsaDims dims;
  dims.B = 1;
  dims.H = 12;
  dims.G = 2;
  dims.D = 64;
  std::vector<std::int64_t> Ts = {1024, 4096, 16384};
  std::string dtype = "fp32";
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: nsa_cpu_bench [--T 1024,4096,16384] [--dtype fp32|fp64] [--reps R] "
                  "[--B b] [--H h] [--G g] [--D d] [--l l] [--d d] [--lsel l'] [--n n] [--w w]\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--T") Ts = parse_list(v);
    else if (a == "--dtype") dtype = v;
    else if (a == "--reps") reps = std::max(1, std::atoi(v.c_str()));
    else if (a == "--B") dims.B = std::stoll(v);
    else if (a == "--H") dims.H = std::stoll(v);
    else if (a == "--G") dims.G = std::stoll(v);
    else if (a == "--D") dims.D = std::stoll(v);
    else if (a == "--l") dims.cmp_block = std::stoll(v);
    else if (a == "--d") dims.cmp_stride = std::stoll(v);
    else if (a == "--lsel") dims.sel_block = std::stoll(v);
    else if (a == "--n") dims.sel_count = std::stoll(v);
    else if (a == "--w") dims.window = std::stoll(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("NSA core, CPU: B=%lld H=%lld G=%lld D=%lld l=%lld d=%lld l'=%lld n=%lld w=%lld, "
              "median of %d runs after a warm-up\n",
              (long long)dims.B, (long long)dims.H, (long long)dims.G, (long long)dims.D,
              (long long)dims.cmp_block, (long long)dims.cmp_stride, (long long)dims.sel_block,
              (long long)dims.sel_count, (long long)dims.window, reps);
  std::printf("|      T | type | th | fwd ms    | bwd ms    | total ms  | fwd Mpair/s | bwd Mpair/s | saved MiB |\n");
  std::printf("|-------:|------|---:|----------:|----------:|----------:|--------:|--------:|---------:|\n");
  for (std::int64_t T : Ts) {
    dims.T = T;
    try {
      dims.validate();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
    if (dtype == "fp64") run<double>(dims, reps);
    else run<float>(dims, reps);
  }
  return 0;
}
