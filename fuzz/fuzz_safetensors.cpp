// libFuzzer target: any byte string given to the SafeTensors reader must load or throw
// frink::Error, and every tensor view must lie inside the input.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "format/model_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto mf = frink::ModelFile::from_safetensors_bytes(data, size, "fuzz.safetensors");
    volatile size_t sink = 0;
    for (const auto& t : mf->tensors()) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
  } catch (const frink::Error&) {
  }
  return 0;
}
