// MappedFile: a whole file mapped read-only into memory (mmap, PROT_READ, MAP_PRIVATE).
// Token shards are read through it, so a multi-GB dataset costs address space, not memory,
// and every rank on a node shares the page cache.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nsatron::data {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path`; throws UserError naming the file when it cannot be opened or mapped.
  // An empty file is valid and maps to size() == 0 (data() is then nullptr).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// True when `path` names an existing regular file.
bool file_exists(const std::string& path);

}  // namespace nsatron::data
