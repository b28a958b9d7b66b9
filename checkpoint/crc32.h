// CRC-32 of the dataset bytes in a checkpoint (docs/checkpoint.md, "Checksums").
//
// The CRC-32 of zlib, gzip, PNG and Ethernet (ISO-HDLC): reflected polynomial 0xEDB88320,
// initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF; crc32("123456789") = 0xCBF43926. Python's
// zlib.crc32 computes the same value, so a checkpoint can be checked with h5py alone:
//     zlib.crc32(dataset[...].astype("<f4").tobytes()) == dataset.attrs["crc32"]
// Implemented here (slicing by 8: eight 256-entry tables, eight bytes per step).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace nsatron::checkpoint {

// `crc` continues a previous value: crc32(ab) == crc32(b, crc32(a)).
std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc = 0);
inline std::uint32_t crc32(std::string_view s, std::uint32_t crc = 0) { return crc32(s.data(), s.size(), crc); }

// One byte at a time, from the definition; for tests of the fast path.
std::uint32_t crc32_bytewise(const void* data, std::size_t bytes, std::uint32_t crc = 0);

}  // namespace nsatron::checkpoint
