// Element types and devices of a tensor, and the bf16 storage type.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace nsatron {

enum class DType : std::uint8_t { F32, F64, BF16 };
enum class Device : std::uint8_t { CPU, CUDA };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
  }
  return 0;
}
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
  }
  return "?";
}
constexpr std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

// bfloat16 as stored: the upper 16 bits of an IEEE float. Conversion from float rounds to
// nearest, ties to even; NaN stays NaN.
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const {
    std::uint32_t u = std::uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static std::uint16_t from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return std::uint16_t((u >> 16) | 0x40);
    std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return std::uint16_t((u + rounding) >> 16);
  }
};

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }

}  // namespace nsatron
