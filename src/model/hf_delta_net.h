// The Gated DeltaNet hybrids' part of the SafeTensors translation (hf_config.cpp): Qwen3-Next
// and Qwen3.5 text, named and laid out as llama.cpp's converter writes them.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/model_file.h"

namespace frink::hf {

// ssm.* keys, the recurrent layers (from layer_types), the shared expert's width.
void set_delta_net_meta(const nlohmann::json& cfg, Metadata& meta, const std::string& arch);
// Appends the GGUF tensor(s) for a linear-attention, shared-expert or post-attention-norm
// tensor and returns true; false when `t` is none of these.
bool translate_delta_net_tensor(ModelFile& file, const nlohmann::json& cfg, const TensorView& t,
                                std::vector<TensorView>& out);

}  // namespace frink::hf
