// libFuzzer target: any byte string given to the GGUF reader must load or throw frink::Error,
// and every view of a loaded file must lie inside the input (ASan sees the exact-size buffer).
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "format/model_file.h"

namespace {

// Reads every value, so a broken MetaValue (bad variant, dangling array) would show.
size_t walk(const frink::MetaValue& v) {
  if (v.is_array()) {
    size_t n = 0;
    for (const auto& item : v.as_array()) n += walk(item);
    return n;
  }
  if (v.type() == frink::GgufType::STRING) return v.as_string().size();
  if (v.is_float()) return v.as_float() != 0;
  return v.type() == frink::GgufType::UINT64 ? v.as_uint64() : static_cast<size_t>(v.as_int());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto mf = frink::ModelFile::from_gguf_bytes(data, size, "fuzz.gguf");
    volatile size_t sink = 0;
    for (const auto& [k, v] : mf->metadata().entries()) sink = sink + k.size() + walk(v);
    for (const auto& t : mf->tensors()) {
      sink = sink + t.data[0] + t.data[t.n_bytes - 1];  // first and last byte are in range
      sink = sink + static_cast<size_t>(t.n_rows()) * t.row_bytes() - t.n_bytes;
    }
  } catch (const frink::Error&) {
  }
  return 0;
}
