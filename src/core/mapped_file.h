// A read-only memory mapping of a whole file. Model weights are used in place from the
// mapping (zero copy); every reader bounds-checks offsets against size() before use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace frink {

class MappedFile {
 public:
  // Throws frink::Error with the path and errno text when the file can't be opened/mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace frink
