// Tokenizer::from_hf_json and from_gpt2_files: Hugging Face tokenizer.json and GPT-2 style
// encoder.json + vocab.bpe, translated into the vocabulary llama.cpp's convert_hf_to_gguf.py
// would have written (added tokens: "special" -> CONTROL, else USER_DEFINED; WordPiece pieces
// get U+2581 at word starts and lose "##" on continuations), then finished like a GGUF one.
// Supported: BPE with a ByteLevel pre-tokenizer, and WordPiece; anything else is refused.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace frink {

namespace {

using nlohmann::json;
using tok::Vocab;

json parse_json(const std::string& text, const char* what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", what, e.what());
  }
}

// Fills v.tokens from an id -> text table (ids must cover [0, n) except gaps, which become
// "[EMPTY_i]" UNUSED placeholders as llama.cpp names empty tokens).
void fill_tokens(Vocab& v, std::vector<std::string> texts, const std::vector<uint32_t>& attrs) {
  for (size_t i = 0; i < texts.size(); ++i) tok::add_token(v, std::move(texts[i]), 0.0f, attrs[i]);
}

void place(std::vector<std::string>& texts, std::vector<uint32_t>& attrs, int64_t id,
           std::string text, uint32_t attr) {
  if (id < 0 || id > (1 << 24)) fail("token id {} out of range in tokenizer.json", id);
  if (static_cast<size_t>(id) >= texts.size()) {
    texts.resize(id + 1);
    attrs.resize(id + 1, tok::kAttrUnused);
  }
  texts[id] = std::move(text);
  attrs[id] = attr;
}

std::string guess_pre(const json& j) {
  const std::string dump = j.contains("pre_tokenizer") ? j["pre_tokenizer"].dump() : "";
  if (dump.find("\\\\p{N}{1,3}") != std::string::npos) return "llama3";
  if (dump.find("\\\\p{L}+|\\\\p{N}|") != std::string::npos) return "qwen2";
  return "gpt-2";
}

int32_t first_present(const Vocab& v, std::initializer_list<std::string_view> texts) {
  for (std::string_view t : texts)
    if (v.find(t) != tok::kNoToken) return v.find(t);
  return tok::kNoToken;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& text, std::string_view pre) {
  const json j = parse_json(text, "tokenizer.json");
  if (!j.contains("model") || !j["model"].contains("vocab")) fail("tokenizer.json has no model.vocab");
  const json& model = j["model"];
  const std::string type = model.value("type", "BPE");
  const bool byte_level = j.contains("pre_tokenizer") && j["pre_tokenizer"].dump().find("ByteLevel") != std::string::npos;
  if (type == "BPE" && !byte_level) fail("tokenizer.json: only byte-level BPE is supported (no ByteLevel pre-tokenizer)");
  if (type != "BPE" && type != "WordPiece") fail("tokenizer.json: unsupported model type '{}'", type);

  Vocab v;
  std::vector<std::string> texts;
  std::vector<uint32_t> attrs;
  const bool wpm = type == "WordPiece";
  for (const auto& [tok_text, id] : model["vocab"].items()) {
    std::string t = tok_text;
    if (wpm && !(t.size() >= 2 && t.front() == '[' && t.back() == ']'))  // convert_hf_to_gguf phantom()
      t = t.rfind("##", 0) == 0 ? t.substr(2) : "\xE2\x96\x81" + t;
    place(texts, attrs, id.get<int64_t>(), std::move(t), tok::kAttrNormal);
  }
  for (const json& a : j.value("added_tokens", json::array())) {
    const int64_t id = a.at("id").get<int64_t>();
    place(texts, attrs, id, a.at("content").get<std::string>(),
          a.value("special", false) ? tok::kAttrControl : tok::kAttrUserDefined);
  }
  for (size_t i = 0; i < texts.size(); ++i)
    if (texts[i].empty()) texts[i] = "[EMPTY_" + std::to_string(i) + "]";

  if (wpm) {
    tok::set_type_defaults(v, "bert", "");
    fill_tokens(v, std::move(texts), attrs);
    v.bos = first_present(v, {"[CLS]"}), v.sep = first_present(v, {"[SEP]"});
    v.unk = first_present(v, {model.value("unk_token", "[UNK]")});
    v.pad = first_present(v, {"[PAD]"}), v.mask = first_present(v, {"[MASK]"});
    if (v.unk != tok::kNoToken) v.tokens[v.unk].attr = tok::kAttrUnknown;
    if (j.contains("normalizer") && j["normalizer"].is_object())
      v.lowercase = v.strip_accents = j["normalizer"].value("lowercase", true);
  } else {
    tok::set_type_defaults(v, "gpt2", pre.empty() ? guess_pre(j) : std::string(pre));
    fill_tokens(v, std::move(texts), attrs);
    const json& merges = model.value("merges", json::array());
    v.bpe_ranks.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      const std::string line = m.is_string() ? m.get<std::string>()
                                             : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>();
      tok::add_merge(v, line, static_cast<int>(i));
    }
    // BOS: the first special token of the post-processor's single-sequence template.
    v.bos = v.eos = tok::kNoToken;
    const json single = j.contains("post_processor") && j["post_processor"].is_object()
                            ? j["post_processor"].value("single", json::array()) : json::array();
    if (!single.empty() && single[0].contains("SpecialToken"))
      v.bos = first_present(v, {single[0]["SpecialToken"].value("id", "")});
    v.add_bos = v.bos != tok::kNoToken;
    v.eos = first_present(v, {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>", "<eos>"});
  }
  tok::finish_vocab(v, "");
  return std::make_unique<Tokenizer>(std::move(v));
}

std::unique_ptr<Tokenizer> Tokenizer::from_gpt2_files(const std::string& encoder_json_text,
                                                      const std::string& vocab_bpe_text,
                                                      std::string_view pre) {
  const json enc = parse_json(encoder_json_text, "encoder.json");
  if (!enc.is_object()) fail("encoder.json is not an object of token -> id");
  Vocab v;
  tok::set_type_defaults(v, "gpt2", pre);
  std::vector<std::string> texts;
  std::vector<uint32_t> attrs;
  for (const auto& [t, id] : enc.items()) place(texts, attrs, id.get<int64_t>(), t, tok::kAttrNormal);
  for (size_t i = 0; i < texts.size(); ++i)
    if (texts[i].empty()) texts[i] = "[EMPTY_" + std::to_string(i) + "]";
  fill_tokens(v, std::move(texts), attrs);

  int rank = 0;
  size_t pos = 0;
  while (pos < vocab_bpe_text.size()) {
    size_t eol = vocab_bpe_text.find('\n', pos);
    if (eol == std::string::npos) eol = vocab_bpe_text.size();
    std::string_view line(vocab_bpe_text.data() + pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = eol + 1;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    tok::add_merge(v, line, rank++);
  }
  v.bos = v.eos = tok::kNoToken;
  v.add_bos = false;  // the files name no BOS
  tok::finish_vocab(v, "");
  return std::make_unique<Tokenizer>(std::move(v));
}

}  // namespace frink
