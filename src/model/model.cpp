#include "model/model.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "model/hf_config.h"

namespace frink {

namespace arch {
// Each architecture family's file defines its rows (src/model/arch_*.cpp).
extern const ArchDef kLlama, kMistral3, kQwen2, kQwen3, kPhi3, kGemma2, kGemma3, kBloom,
    kStarcoder2, kFalcon;
extern const ArchDef kQwen2Moe, kQwen3Moe, kOlmoe, kGptOss;  // arch_moe.cpp, arch_gpt_oss.cpp
extern const ArchDef kDeepseek2;  // arch_deepseek2.cpp
extern const ArchDef kQwen3Next, kQwen35, kQwen35Moe;  // arch_qwen3next.cpp
extern const ArchDef kGraniteHybrid;                  // arch_granite_hybrid.cpp
}  // namespace arch

namespace {
const std::vector<const ArchDef*>& registry() {
  static const std::vector<const ArchDef*> kArchs = {
      &arch::kLlama, &arch::kMistral3, &arch::kQwen2,  &arch::kQwen3,      &arch::kPhi3,
      &arch::kGemma2, &arch::kGemma3,  &arch::kBloom,  &arch::kStarcoder2, &arch::kFalcon,
      &arch::kQwen2Moe, &arch::kQwen3Moe, &arch::kOlmoe, &arch::kGptOss,
      &arch::kDeepseek2,
      &arch::kQwen3Next, &arch::kQwen35, &arch::kQwen35Moe, &arch::kGraniteHybrid,
  };
  return kArchs;
}
}  // namespace

const ArchDef* find_arch(std::string_view name) {
  for (const ArchDef* a : registry())
    if (a->name == name) return a;
  return nullptr;
}

std::vector<std::string_view> supported_archs() {
  std::vector<std::string_view> names;
  for (const ArchDef* a : registry()) names.push_back(a->name);
  return names;
}

std::unique_ptr<Model> load_model(const std::string& path) {
  auto m = std::make_unique<Model>();
  m->file = ModelFile::open(path);
  if (m->file->format() == FileFormat::kSafeTensors) translate_hf_model(*m->file);
  const Metadata& meta = m->file->metadata();
  auto arch_name = meta.try_string("general.architecture");
  if (!arch_name) fail("{}: no general.architecture key; is this a model file?", path);
  const ArchDef* def = find_arch(*arch_name);
  if (!def)
    fail("{}: unknown architecture '{}' (frink supports: {})", path, *arch_name,
         fmt::join(supported_archs(), ", "));
  m->hp.arch = *arch_name;
  def->read_hparams(meta, m->hp);
  if (m->hp.n_vocab <= 0) {
    const TensorView* emb = m->file->find("token_embd.weight");
    if (!emb || emb->ne.size() < 2) fail("{}: required tensor 'token_embd.weight' is missing", path);
    m->hp.n_vocab = emb->ne[1];
  }
  WeightLoader ld(*m->file, m->w);
  m->w.layers.resize(static_cast<size_t>(m->hp.n_layer));
  def->load_weights(m->hp, ld, m->w);
  FRINK_LOG_DEBUG("loaded {} ({}): {} layers, n_embd {}, vocab {}", path, m->hp.arch, m->hp.n_layer,
                  m->hp.n_embd, m->hp.n_vocab);
  return m;
}

int64_t Hparams::max_kv_width() const {
  int64_t w = 0;
  for (const auto& p : layers) w = std::max<int64_t>({w, p.n_head_kv * p.head_dim_k, p.n_head_kv * p.head_dim_v});
  return w;
}

}  // namespace frink
