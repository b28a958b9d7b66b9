// Deterministic random numbers, identical on every platform and compiler (the standard
// library's distributions are not): splitmix64 for bits, Box-Muller for normals.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

namespace nsatron {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1): never exactly 0, so log() is safe.
  double uniform() { return (double(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  // Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(6.283185307179586 * u2);
    has_spare_ = true;
    return r * std::cos(6.283185307179586 * u2);
  }
  std::uint64_t state() const { return state_; }

 private:
  std::uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// A seed for a named stream: the same (seed, name) gives the same numbers wherever and in
// whatever order it is asked for (FNV-1a of the name, mixed with the seed).
inline std::uint64_t stream_seed(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  SplitMix64 mix(seed ^ h);
  return mix.next();
}

}  // namespace nsatron
