// Tokenizer::from_gguf: the tokenizer.ggml.* keys, read as llama.cpp's
// llama_vocab::impl::load reads them (defaults per model type first, then the file's keys;
// an out-of-range special id keeps the default, a default out of range is dropped).
#include "core/error.h"
#include "format/metadata.h"
#include "tokenizer/tokenizer.h"

namespace frink {

namespace {

using tok::Vocab;

void read_tokens(Vocab& v, const Metadata& meta) {
  const MetaValue* list = meta.find("tokenizer.ggml.tokens");
  if (!list) fail("cannot find tokenizer vocab in model file (tokenizer.ggml.tokens)");
  if (!list->is_array() || list->elem_type() != GgufType::STRING)
    fail("tokenizer.ggml.tokens is not an array of strings");
  std::vector<std::string> texts = list->as_strings();
  const size_t n = texts.size();

  std::vector<float> scores;
  if (const MetaValue* s = meta.find("tokenizer.ggml.scores")) {
    if (!s->is_array() || (s->elem_type() != GgufType::FLOAT32 && s->elem_type() != GgufType::INT32))
      fail("invalid gguf type for tokenizer.ggml.scores");
    scores = s->as_floats();
    if (scores.size() < n) fail("tokenizer.ggml.scores has {} entries for {} tokens", scores.size(), n);
  }
  std::vector<int64_t> types;
  if (const MetaValue* t = meta.find("tokenizer.ggml.token_type")) {
    if (!t->is_array() || t->elem_type() != GgufType::INT32)
      fail("invalid gguf type for tokenizer.ggml.token_type");
    types = t->as_ints();
    if (types.size() < n) fail("tokenizer.ggml.token_type has {} entries for {} tokens", types.size(), n);
  }
  v.tokens.reserve(n);
  v.token_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    tok::add_token(v, std::move(texts[i]), scores.empty() ? 0.0f : scores[i],
                   types.empty() ? tok::kAttrNormal : tok::attr_from_token_type(types[i]));
  }
}

void read_special_ids(Vocab& v, const Metadata& meta) {
  const std::pair<const char*, int32_t*> keys[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},
      {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},
      {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},
      {"tokenizer.ggml.seperator_token_id", &v.sep},  // sic: llama.cpp's key spelling
      {"tokenizer.ggml.padding_token_id", &v.pad},
      {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.fim_pre_token_id", &v.fim_pre},
      {"tokenizer.ggml.fim_suf_token_id", &v.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v.fim_mid},
      {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v.fim_pre},  // deprecated spellings
      {"tokenizer.ggml.suffix_token_id", &v.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.fim_mid},
  };
  for (const auto& [key, id] : keys) {
    if (*id >= v.n_tokens()) *id = tok::kNoToken;
    const std::optional<int64_t> value = meta.try_int(key);
    if (value && *value >= 0 && *value < v.n_tokens()) *id = static_cast<int32_t>(*value);
  }
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const Metadata& meta) {
  Vocab v;
  const std::string model = meta.get_string("tokenizer.ggml.model");
  tok::set_type_defaults(v, model, meta.try_string("tokenizer.ggml.pre").value_or(""));
  if (auto b = meta.try_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;

  read_tokens(v, meta);
  if (v.type == tok::VocabType::kBpe) {
    const MetaValue* merges = meta.find("tokenizer.ggml.merges");
    if (!merges) fail("cannot find tokenizer merges in model file (tokenizer.ggml.merges)");
    const std::vector<std::string> lines = merges->as_strings();
    v.bpe_ranks.reserve(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) tok::add_merge(v, lines[i], static_cast<int>(i));
  }
  read_special_ids(v, meta);
  if (auto b = meta.try_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
  if (auto b = meta.try_bool("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
  if (auto b = meta.try_bool("tokenizer.ggml.add_sep_token")) v.add_sep = *b;
  if (auto b = meta.try_bool("tokenizer.ggml.normalizer.lowercase")) v.lowercase = *b;
  v.strip_accents = v.lowercase;
  if (auto b = meta.try_bool("tokenizer.ggml.normalizer.strip_accents")) v.strip_accents = *b;

  tok::finish_vocab(v, meta.try_string("general.name").value_or(""));
  if (v.add_bos && v.bos == tok::kNoToken) fail("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
  if (v.add_eos && v.eos == tok::kNoToken) fail("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set");
  return std::make_unique<Tokenizer>(std::move(v));
}

}  // namespace frink
