#include "model/hf_config.h"

#include "core/error.h"

namespace frink {

void translate_hf_model(ModelFile& file) {
  fail("{}: SafeTensors models are not wired up yet", file.path());
}

}  // namespace frink
