// ModelFile::open: picks the reader from the path and the first bytes.
#include "format/model_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "format/gguf_reader.h"
#include "format/safetensors_reader.h"

namespace frink {

namespace fs = std::filesystem;

int64_t TensorView::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // products were overflow-checked by the reader
  return n;
}

const TensorView* ModelFile::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

size_t ModelFile::file_bytes() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->size();
  return n;
}

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The first 4 bytes, or fewer when the file is shorter.
std::string first_bytes(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open {}", path);
  std::string s(n, '\0');
  f.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(f.gcount()));
  return s;
}

}  // namespace

std::unique_ptr<ModelFile> ModelFile::open(const std::string& path) {
  auto mf = std::make_unique<ModelFile>();
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    safetensors::open_folder(path, *mf);
    return mf;
  }
  if (!fs::exists(path, ec)) fail("cannot open {}: no such file or directory", path);
  if (ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json")) {
    safetensors::open(path, *mf);
    return mf;
  }
  std::string head = first_bytes(path, 9);
  if (head.size() >= 4 && std::memcmp(head.data(), "GGUF", 4) == 0) {
    gguf::open(path, *mf);
    return mf;
  }
  if (head.size() == 9 && head[8] == '{') {  // u64 header length, then the JSON header
    safetensors::open(path, *mf);
    return mf;
  }
  fail("{}: not a GGUF or SafeTensors file", path);
}

std::unique_ptr<ModelFile> ModelFile::from_gguf_bytes(const uint8_t* data, size_t n_bytes,
                                                      const std::string& name) {
  auto mf = std::make_unique<ModelFile>();
  gguf::GgufPart part = gguf::parse(data, n_bytes, name);
  mf->format_ = FileFormat::kGguf;
  mf->path_ = name;
  mf->gguf_version_ = part.version;
  mf->meta_ = std::move(part.meta);
  mf->tensors_ = std::move(part.tensors);
  return mf;
}

std::unique_ptr<ModelFile> ModelFile::from_safetensors_bytes(const uint8_t* data, size_t n_bytes,
                                                             const std::string& name) {
  auto mf = std::make_unique<ModelFile>();
  mf->format_ = FileFormat::kSafeTensors;
  mf->path_ = name;
  safetensors::parse(data, n_bytes, name, mf->tensors_, mf->meta_);
  return mf;
}

}  // namespace frink
