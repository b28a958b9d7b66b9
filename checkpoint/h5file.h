// One checkpoint file (HDF5): writing it, and reading it with every check the format
// allows. Internal to checkpoint/ (and its tests); checkpoint.h is the public API.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace nsatron::checkpoint {

// One dataset of a file as its attributes describe it.
struct DatasetInfo {
  std::string name;
  Shape shape;         // the dataset's (shard's) shape
  Shape global_shape;  // attribute global_shape
  Shape offset;        // attribute offset
  std::uint32_t crc32 = 0;  // attribute crc32
  std::string dtype;   // "fp32" when float32 little-endian (the only type written)
};

// The text whose CRC-32 is the root attribute state_crc32 (docs/checkpoint.md): one line
// "key=value\n" per root attribute, in the documented order.
std::string state_digest_text(const TrainState& state, const FileLayout& layout, std::int64_t format_version,
                              const std::vector<std::string>& manifest);

// An open checkpoint file. The constructor reads and checks the root attributes (their
// presence and types, the format version, state_crc32) and throws UserError naming the file
// when the file is missing, truncated, not HDF5, or its attributes are wrong.
class CheckpointFile {
 public:
  explicit CheckpointFile(const std::filesystem::path& file);
  ~CheckpointFile();
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;
  CheckpointFile(CheckpointFile&& o) noexcept;

  const std::filesystem::path& path() const { return path_; }
  const TrainState& state() const { return state_; }
  const FileLayout& layout() const { return layout_; }
  std::int64_t format_version() const { return version_; }
  // Root attribute `datasets`: the datasets the writer put in this file, in order.
  const std::vector<std::string>& manifest() const { return manifest_; }
  bool lists(const std::string& name) const;
  // Every dataset actually in the file (walking its groups), sorted.
  std::vector<std::string> datasets_in_file() const;

  // Throws UserError ("FILE: NAME: what") when the dataset is missing or its attributes are
  // missing or inconsistent (offset + shape beyond global_shape, wrong ranks, not fp32).
  DatasetInfo info(const std::string& name) const;
  // Reads the shard (shape_numel(info.shape) floats) into `out` and checks its CRC-32;
  // throws UserError naming the file and dataset on a mismatch or read error.
  void read(const DatasetInfo& info, float* out) const;

 private:
  std::filesystem::path path_;
  std::int64_t file_ = -1;  // hid_t
  TrainState state_;
  FileLayout layout_;
  std::int64_t version_ = 0;
  std::vector<std::string> manifest_;
};

}  // namespace nsatron::checkpoint
