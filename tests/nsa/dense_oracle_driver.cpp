// Driver for tests/nsa/oracle_dense.py: runs the dense attention core (nsa/dense.h) in fp64 on
// inputs from raw little-endian float64 files and writes its results the same way.
//
//   dense_oracle_driver DIR B T H G D THETA
//
// Reads DIR/q.bin [B,T,H,D], DIR/k.bin, DIR/v.bin [B,T,G,D], DIR/d_out.bin [B,T,H,D]; writes
// DIR/out.bin, DIR/lse.bin [B,T,H], DIR/dq.bin, DIR/dk.bin, DIR/dv.bin (the backward of
// sum(out * d_out)). Exit 1 with a message on stderr on any error.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "nsa/dense.h"

namespace {

std::vector<double> read_doubles(const std::string& path, std::int64_t n) {
  std::vector<double> v(static_cast<std::size_t>(n));
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 8)) || in.peek() != EOF)
    throw std::runtime_error(path + ": expected exactly " + std::to_string(n) + " float64 values");
  return v;
}

void write_doubles(const std::string& path, const std::vector<double>& v) {
  std::ofstream out(path, std::ios::binary);
  if (!out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 8)))
    throw std::runtime_error(path + ": write failed");
}

int run(int argc, char** argv) {
  if (argc != 8) throw std::invalid_argument("usage: dense_oracle_driver DIR B T H G D THETA");
  const std::string dir = argv[1];
  nsatron::nsa::DenseDims d;
  d.B = std::stoll(argv[2]);
  d.T = std::stoll(argv[3]);
  d.H = std::stoll(argv[4]);
  d.G = std::stoll(argv[5]);
  d.D = std::stoll(argv[6]);
  d.rope_theta = std::stod(argv[7]);
  const std::int64_t nq = d.B * d.T * d.H * d.D, nk = d.B * d.T * d.G * d.D;
  const auto q = read_doubles(dir + "/q.bin", nq), k = read_doubles(dir + "/k.bin", nk);
  const auto v = read_doubles(dir + "/v.bin", nk), d_out = read_doubles(dir + "/d_out.bin", nq);
  std::vector<double> out(q.size()), lse(static_cast<std::size_t>(d.B * d.T * d.H));
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  nsatron::nsa::dense_forward<double>(d, q.data(), k.data(), v.data(), out.data(), lse.data());
  nsatron::nsa::dense_backward<double>(d, q.data(), k.data(), v.data(), out.data(), lse.data(), d_out.data(),
                                       dq.data(), dk.data(), dv.data());
  write_doubles(dir + "/out.bin", out);
  write_doubles(dir + "/lse.bin", lse);
  write_doubles(dir + "/dq.bin", dq);
  write_doubles(dir + "/dk.bin", dk);
  write_doubles(dir + "/dv.bin", dv);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dense_oracle_driver: %s\n", e.what());
    return 1;
  }
}
