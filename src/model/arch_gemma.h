// Gemma's one shape rule that two readers need: arch_gemma.cpp sets the query scale from it,
// and the SafeTensors translation (hf_config.cpp) checks config.json's query_pre_attn_scalar
// against it.
#pragma once

#include <cstdint>
#include <string_view>

namespace frink::arch {

// Gemma 2/3's query_pre_attn_scalar: queries are multiplied by 1/sqrt of it. llama.cpp
// derives it from the shape, which covers every released model: n_embd / n_head for the
// 27B models (gemma2 with 46 layers, gemma3 with 62), head_dim for every other size.
// arch is the GGUF architecture ("gemma2", "gemma3").
int64_t gemma_query_pre_attn_scalar(std::string_view arch, int64_t n_layer, int64_t n_embd, int64_t n_head,
                                    int64_t head_dim);

}  // namespace frink::arch
