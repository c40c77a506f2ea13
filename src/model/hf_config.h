// SafeTensors models speak Hugging Face's language: config.json keys and tensor names
// like "model.layers.0.self_attn.q_proj.weight". This translates both into GGUF's
// vocabulary (the keys llama.cpp's converter writes, and its tensor names), so the
// architecture readers above see one kind of model file.
#pragma once

#include "format/model_file.h"

namespace frink {

// Rewrites file's metadata and tensor names in place. Throws frink::Error for a config
// that is missing, broken, or of a model type frink does not know.
void translate_hf_model(ModelFile& file);

}  // namespace frink
