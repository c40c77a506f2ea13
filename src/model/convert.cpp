#include "model/convert.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <regex>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/read_file.h"
#include "format/gguf_writer.h"
#include "model/model.h"
#include "quant/quant.h"

namespace frink {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// llama.cpp's llama_token_type (gguf.TokenType).
constexpr int32_t kTokNormal = 1, kTokControl = 3, kTokUserDefined = 4, kTokUnused = 5;

json parse_json(const std::string& text, const fs::path& p) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: broken JSON: {}", p.string(), e.what());
  }
}

// llama_ftype for a file whose matrices are of type t.
uint32_t file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q8_0: return 7;
    case GgmlType::BF16: return 32;
    default: FRINK_ASSERT(false, "parse_convert_type admits F32, F16, BF16 and Q8_0 only");
  }
  return 0;
}

// The GGUF form of a byte-level BPE tokenizer.json, as convert_hf_to_gguf.py writes it
// (get_vocab_base + gguf.SpecialVocab).
class VocabWriter {
 public:
  VocabWriter(const fs::path& dir, const json& config) : dir_(dir), config_(config) {
    const fs::path tj = dir / "tokenizer.json";
    if (!fs::exists(tj)) fail("{}: no tokenizer.json beside the weights", dir.string());
    tok_ = parse_json(read_file(tj), tj);
    const fs::path tc = dir / "tokenizer_config.json";
    tok_config_ = fs::exists(tc) ? parse_json(read_file(tc), tc) : json::object();
  }

  void write(GgufWriter& w, int64_t n_vocab_config) {
    check_supported();
    build_tokens(n_vocab_config);
    MetaValue::Array tokens, types, merges;
    for (size_t i = 0; i < tokens_.size(); ++i) {
      tokens.push_back(MetaValue::of_string(tokens_[i]));
      types.push_back(MetaValue::of_int(GgufType::INT32, types_[i]));
    }
    for (const auto& m : tok_["model"].value("merges", json::array())) {
      // tokenizers < 0.20 wrote "a b"; later versions write ["a", "b"].
      if (m.is_string()) merges.push_back(MetaValue::of_string(m.get<std::string>()));
      else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
        merges.push_back(MetaValue::of_string(m[0].get<std::string>() + " " + m[1].get<std::string>()));
      else fail("tokenizer.json: a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
    w.set("tokenizer.ggml.model", MetaValue::of_string("gpt2"));
    w.set("tokenizer.ggml.pre", MetaValue::of_string("gpt-2"));
    w.set("tokenizer.ggml.tokens", MetaValue::of_array(GgufType::STRING, std::move(tokens)));
    w.set("tokenizer.ggml.token_type", MetaValue::of_array(GgufType::INT32, std::move(types)));
    w.set("tokenizer.ggml.merges", MetaValue::of_array(GgufType::STRING, std::move(merges)));
    const int64_t bos = special_id("bos"), eos = special_id("eos"), pad = special_id("pad");
    if (bos >= 0) w.set("tokenizer.ggml.bos_token_id", MetaValue::of_int(GgufType::UINT32, bos));
    if (eos >= 0) w.set("tokenizer.ggml.eos_token_id", MetaValue::of_int(GgufType::UINT32, eos));
    if (pad >= 0) w.set("tokenizer.ggml.padding_token_id", MetaValue::of_int(GgufType::UINT32, pad));
    w.set("tokenizer.ggml.add_bos_token", MetaValue::of_bool(adds(bos, true)));
    w.set("tokenizer.ggml.add_eos_token", MetaValue::of_bool(adds(eos, false)));
  }

  int64_t n_tokens() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  // The one tokenizer whose llama.cpp pre-tokenizer is certain: byte-level BPE with GPT-2's
  // regex and no prefix space, no normalizer, merges applied (llama.cpp's "gpt-2").
  void check_supported() const {
    const json& model = tok_.value("model", json::object());
    if (model.value("type", "") != "BPE") fail("tokenizer.json: model type '{}' is not BPE", model.value("type", ""));
    if (model.value("ignore_merges", false) || model.value("byte_fallback", false))
      fail("tokenizer.json: ignore_merges / byte_fallback BPE is not the GPT-2 scheme convert writes");
    if (tok_.contains("normalizer") && !tok_["normalizer"].is_null()) fail("tokenizer.json: a normalizer is not supported");
    const json& pre = tok_.value("pre_tokenizer", json::object());
    if (!pre.is_object() || pre.value("type", "") != "ByteLevel" || !pre.value("use_regex", true) ||
        pre.value("add_prefix_space", true))
      fail("tokenizer.json: the pre-tokenizer must be ByteLevel(add_prefix_space=false, use_regex=true), "
           "GPT-2's regex (llama.cpp's 'gpt-2')");
  }

  void build_tokens(int64_t n_vocab_config) {
    std::vector<std::pair<std::string, int64_t>> entries;
    for (const auto& [text, id] : tok_["model"]["vocab"].items()) entries.emplace_back(text, id.get<int64_t>());
    std::vector<std::pair<int64_t, bool>> added;  // id, special
    for (const auto& a : tok_.value("added_tokens", json::array())) {
      entries.emplace_back(a.at("content").get<std::string>(), a.at("id").get<int64_t>());
      added.emplace_back(a.at("id").get<int64_t>(), a.value("special", false));
    }
    int64_t n = n_vocab_config;
    for (const auto& e : entries) n = std::max(n, e.second + 1);
    tokens_.assign(size_t(n), "");
    types_.assign(size_t(n), kTokUnused);
    for (int64_t i = 0; i < n; ++i) tokens_[size_t(i)] = "[PAD" + std::to_string(i) + "]";  // llama.cpp's filler
    for (const auto& [text, id] : entries) {
      if (id < 0) fail("tokenizer.json: negative token id {}", id);
      tokens_[size_t(id)] = text;
      types_[size_t(id)] = kTokNormal;
      ids_[text] = id;
    }
    for (const auto& [id, special] : added) types_[size_t(id)] = special ? kTokControl : kTokUserDefined;
  }

  // "bos" -> tokenizer_config.json's bos_token (a string or {"content": ...}), else
  // config.json's bos_token_id; -1 when neither names one.
  int64_t special_id(const std::string& kind) const {
    if (auto it = tok_config_.find(kind + "_token"); it != tok_config_.end() && !it->is_null()) {
      const std::string text = it->is_object() ? it->value("content", "") : it->get<std::string>();
      auto id = ids_.find(text);
      if (id == ids_.end()) fail("tokenizer_config.json: {}_token '{}' is not in the vocabulary", kind, text);
      return id->second;
    }
    auto it = config_.find(kind + "_token_id");
    if (it != config_.end() && it->is_number_integer()) return it->get<int64_t>();
    return -1;
  }

  // add_bos_token / add_eos_token: tokenizer_config.json's, else whether tokenizer.json's
  // TemplateProcessing puts the token first (BOS) or last (EOS), as gguf.SpecialVocab reads it.
  bool adds(int64_t id, bool first) const {
    const std::string key = first ? "add_bos_token" : "add_eos_token";
    if (auto it = tok_config_.find(key); it != tok_config_.end() && it->is_boolean()) return it->get<bool>();
    const json& pp = tok_.value("post_processor", json::object());
    if (id < 0 || !pp.is_object() || pp.value("type", "") != "TemplateProcessing") return false;
    const json& single = pp.value("single", json::array());
    if (single.empty()) return false;
    const json& e = first ? single.front() : single.back();
    if (!e.contains("SpecialToken")) return false;
    auto it = ids_.find(e["SpecialToken"].value("id", ""));
    return it != ids_.end() && it->second == id;
  }

  fs::path dir_;
  const json& config_;
  json tok_, tok_config_;
  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;
  std::map<std::string, int64_t> ids_;
};

// token_embd, then blocks in numeric order (each block's tensors by name), then the rest:
// the order llama.cpp's converter writes.
std::vector<const TensorView*> write_order(const std::vector<TensorView>& tensors) {
  static const std::regex kBlk(R"(blk\.(\d+)\..*)");
  auto key = [](const TensorView* t) {
    std::smatch m;
    if (t->name.rfind("token_embd.", 0) == 0) return std::make_tuple(0, int64_t{0}, t->name);
    if (std::regex_match(t->name, m, kBlk)) return std::make_tuple(1, int64_t{std::stoll(m[1])}, t->name);
    return std::make_tuple(2, int64_t{0}, t->name);
  };
  std::vector<const TensorView*> out;
  for (const auto& t : tensors) out.push_back(&t);
  std::stable_sort(out.begin(), out.end(), [&](const TensorView* a, const TensorView* b) { return key(a) < key(b); });
  return out;
}

// A matrix's type: the requested one, or F16 when a row is not a whole number of its blocks.
GgmlType matrix_type(GgmlType want, int64_t ne0) {
  return ne0 % ggml_type_info(want).block_elems == 0 ? want : GgmlType::F16;
}

}  // namespace

GgmlType parse_convert_type(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0})
    if (s == ggml_type_name(t)) return t;
  fail("--type {}: convert writes F32, F16, BF16 or Q8_0", s);
}

ConvertSummary convert_to_gguf(const std::string& src_dir, const std::string& out_path, const ConvertOptions& o) {
  (void)file_type(o.type);  // asserts the type is one parse_convert_type admits
  const auto m = load_model(src_dir);
  if (m->file->format() != FileFormat::kSafeTensors)
    fail("{}: convert reads a SafeTensors folder (this is GGUF already)", src_dir);
  const fs::path dir = m->file->hf_dir();
  const json config = parse_json(m->file->hf_config_json(), dir / "config.json");

  GgufWriter w;
  const Metadata& meta = m->file->metadata();
  w.set("general.architecture", meta.get("general.architecture"));
  std::string name = o.name;
  if (name.empty()) name = fs::absolute(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  w.set("general.name", MetaValue::of_string(name));
  if (!o.description.empty()) w.set("general.description", MetaValue::of_string(o.description));
  w.set("general.file_type", MetaValue::of_int(GgufType::UINT32, file_type(o.type)));
  w.set("general.quantization_version", MetaValue::of_int(GgufType::UINT32, 2));
  w.set_all(meta);  // the llama.cpp keys hf_config.cpp translated config.json into

  VocabWriter vocab(dir, config);
  vocab.write(w, m->hp.n_vocab);
  if (vocab.n_tokens() != m->hp.n_vocab)
    fail("tokenizer.json has {} tokens, the model's embedding {} rows", vocab.n_tokens(), m->hp.n_vocab);

  ConvertSummary s;
  s.n_vocab = vocab.n_tokens();
  for (const TensorView* tp : write_order(m->file->tensors())) {
    const TensorView t = *tp;  // a view into the mapping (or the translation's own bytes)
    const GgmlType type = t.ne.size() == 1 ? GgmlType::F32 : matrix_type(o.type, t.ne[0]);
    w.add_tensor(t.name, type, t.ne, [t, type](uint8_t* dst, size_t n_bytes) {
      const int64_t n_rows = t.n_rows(), ne0 = t.ne[0];
      const size_t out_row = ggml_row_bytes(type, ne0);
      FRINK_ASSERT(out_row * static_cast<size_t>(n_rows) == n_bytes);
      std::vector<float> row(static_cast<size_t>(ne0));
      for (int64_t r = 0; r < n_rows; ++r) {
        dequantize_row(t.type, t.row(r), row.data(), ne0);
        quantize_row(type, row.data(), dst + static_cast<size_t>(r) * out_row, ne0);
      }
    });
    ++s.n_tensors;
    s.n_params += t.n_elements();
  }
  w.write(out_path);
  s.file_bytes = fs::file_size(out_path);
  return s;
}

}  // namespace frink
