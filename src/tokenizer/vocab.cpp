// Vocabulary set-up with llama.cpp's rules (llama-vocab.cpp, llama_vocab::impl::load). The
// lists of token texts below (EOT, EOG, FIM, ...) are llama.cpp's: GGUF files do not mark
// these ids, so llama.cpp recognises them by text, and so must we to stop where it stops.
#include "tokenizer/vocab.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace frink::tok {

namespace {

struct PreRule {
  std::initializer_list<std::string_view> names;
  std::string_view kind;  // PreTokenizer kind
  bool clean_spaces;      // llama.cpp's clean_spaces for these names
};

// tokenizer.ggml.pre -> regex kind, as llama.cpp's load() maps names to pre types and
// llm_tokenizer_bpe maps pre types to regexes. Flags other than clean_spaces are set below.
const PreRule kPreRules[] = {
    {{"default"}, "default", true},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano", "dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, "llama3", true},
    {{"deepseek-llm"}, "deepseek-llm", false},
    {{"deepseek-coder"}, "deepseek-coder", false},
    {{"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"}, "deepseek-v3", false},
    {{"falcon"}, "falcon", true},
    {{"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"}, "starcoder", true},
    {{"command-r", "smollm"}, "starcoder", false},
    {{"gpt-2", "mpt", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
      "a.x-4.0", "mellum", "modern-bert", "olmo", "jais", "exaone4", "jina-v1-en", "jina-v2-code",
      "roberta-bpe"}, "gpt2", true},
    {{"trillion", "granite-docling"}, "gpt2", false},
    {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"}, "qwen2", false},
    {{"megrez", "stablelm2"}, "qwen2", true},
    {{"qwen35"}, "qwen35", false},
    {{"poro-chat"}, "poro", false},
    {{"bloom", "gpt3-finnish"}, "poro", true},
    {{"viking"}, "viking", false},
    {{"tekken"}, "tekken", false},
    {{"gpt-4o", "llama4", "kanana2", "talkie"}, "gpt4o", false},
    {{"seed-coder"}, "seed-coder", false},
    {{"bailingmoe", "bailingmoe2", "llada-moe"}, "bailingmoe", false},
    {{"gemma4", "granite-embed-multi-311m"}, "gemma4", true},
};

template <typename Set>
bool is_one_of_set(std::string_view s, const Set& set) {
  return std::find(std::begin(set), std::end(set), s) != std::end(set);
}
bool is_one_of(std::string_view s, std::initializer_list<std::string_view> set) { return is_one_of_set(s, set); }

// Decodes GPT-2 byte-level text back to bytes (llama.cpp's llama_decode_text, including its
// "[UNK_BYTE_0x..]" marker for a codepoint outside the 256).
std::string decode_byte_level(const std::string& text) {
  std::string out;
  for (uint32_t cpt : decode_utf8(text)) {
    const int b = unicode_to_byte(cpt);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      std::string utf8;
      append_utf8(utf8, cpt);
      out += "[UNK_BYTE_0x";
      for (unsigned char c : utf8) out += fmt::format("{:02x}", c);
      out += text + "]";
    }
  }
  return out;
}

std::string unescape_whitespace(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
      out.push_back(' ');
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// llama.cpp's token_to_piece(special = true), which fills its piece cache.
std::string piece_for(const Vocab& v, int32_t id) {
  const TokenData& t = v.tokens[id];
  if (t.attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return t.text;
  if (t.attr & kAttrNormal) {
    if (v.type == VocabType::kBpe && !v.escape_whitespaces) return decode_byte_level(t.text);
    return unescape_whitespace(t.text);
  }
  if ((t.attr & kAttrByte) && t.text.size() >= 5 && v.type != VocabType::kWpm) {
    return std::string(1, static_cast<char>(std::strtol(t.text.substr(3, 2).c_str(), nullptr, 16)));
  }
  return "";
}

void mark_control(Vocab& v, int32_t id) { v.tokens[id].attr |= kAttrControl; }

void detect_special_by_text(Vocab& v) {
  struct Rule { int32_t* id; std::initializer_list<std::string_view> texts; };
  const Rule rules[] = {
      {&v.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
                "<end_of_utterance>"}},
      {&v.eom, {"<|eom_id|>"}},
      {&v.fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                    "▁<PRE>", "<|code_prefix|>", "<|prefix|>"}},
      {&v.fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                    "▁<SUF>", "<|code_suffix|>", "<|suffix|>"}},
      {&v.fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                    "▁<MID>", "<|code_middle|>", "<|middle|>"}},
      {&v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
      {&v.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
      {&v.fim_sep, {"<|file_sep|>"}},
  };
  // llama.cpp walks its hash map; we walk ids in order so the pick is deterministic.
  for (int32_t id = 0; id < v.n_tokens(); ++id) {
    const std::string& text = v.tokens[id].text;
    for (const Rule& r : rules) {
      if (*r.id == kNoToken && is_one_of(text, r.texts)) {
        *r.id = id;
        mark_control(v, id);
      }
    }
  }
}

void build_eog(Vocab& v) {
  static constexpr std::string_view kEogTexts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
      "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
      "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
      "<｜end▁of▁sentence｜>", "[e~["};
  v.eog_ids.clear();
  for (int32_t id : {v.fim_pad, v.fim_rep, v.fim_sep})
    if (id != kNoToken) v.eog_ids.insert(id);
  for (int32_t id = 0; id < v.n_tokens(); ++id) {
    if (is_one_of_set(v.tokens[id].text, kEogTexts)) {
      v.eog_ids.insert(id);
      mark_control(v, id);
    }
  }
  // gpt-oss: these render as text (llama.cpp "quick hack for gpt-oss").
  for (const char* t : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    const int32_t id = v.find(t);
    if (id != kNoToken) v.tokens[id].attr = kAttrUserDefined;
  }
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (id != kNoToken) v.eog_ids.insert(id);

  auto text_of = [&](int32_t id) -> const std::string& { return v.tokens[id].text; };
  // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
  bool has_return = false, has_call = false, has_flush = false;
  int32_t end_id = kNoToken;
  for (int32_t id : v.eog_ids) {
    const std::string& t = text_of(id);
    if (t == "<|return|>") has_return = true;
    else if (t == "<|call|>" || t == "<|calls|>") has_call = true;
    else if (t == "<|flush|>") has_flush = true;
    else if (t == "<|end|>") end_id = id;
  }
  if (end_id != kNoToken && has_call && (has_return || has_flush)) {
    v.eog_ids.erase(end_id);
    v.tokens[end_id].attr = kAttrUserDefined;
  }
  // gemma4 / paddleocr: "</s>" is not an end of generation when "<|tool_response>" is.
  int32_t s_id = kNoToken;
  bool has_tool_response = false;
  for (int32_t id : v.eog_ids) {
    if (text_of(id) == "<|tool_response>") has_tool_response = true;
    else if (text_of(id) == "</s>") s_id = id;
  }
  if (has_tool_response && s_id != kNoToken) {
    v.eog_ids.erase(s_id);
    v.tokens[s_id].attr = kAttrNormal;
  }
}

void set_strip_attrs(Vocab& v, std::string_view general_name) {
  std::string name(general_name);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  auto set = [&](std::string_view text, uint32_t attr, bool on) {
    const int32_t id = v.find(text);
    if (id == kNoToken) return;
    v.tokens[id].attr = on ? (v.tokens[id].attr | attr) : (v.tokens[id].attr & ~attr);
  };
  const auto has = [](const std::string& s, std::string_view sub) { return s.find(sub) != std::string::npos; };
  if (has(v.pre_name, "jina-v2-de") || has(v.pre_name, "jina-v2-es") || has(v.pre_name, "jina-v2-code")) {
    set("<mask>", kAttrLstrip, true);
  } else if (has(name, "phi-3") || has(name, "phi3")) {
    for (int32_t id : v.special_tokens) v.tokens[id].attr |= kAttrRstrip;
    set("</s>", kAttrRstrip, true);
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, kAttrRstrip, false);
  } else if (has(name, "modern-bert")) {
    set("[MASK]", kAttrLstrip, true);
  }
}

}  // namespace

uint32_t attr_from_token_type(int64_t token_type) {
  switch (token_type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

void add_token(Vocab& v, std::string text, float score, uint32_t attr) {
  const auto id = static_cast<int32_t>(v.tokens.size());
  if (text.empty()) text = "[EMPTY_" + std::to_string(id) + "]";
  auto [it, inserted] = v.token_to_id.emplace(text, id);
  if (!inserted) fail("duplicate token in vocabulary: '{}' has ids {} and {}", text, it->second, id);
  v.max_token_len = std::max(v.max_token_len, static_cast<int>(text.size()));
  v.tokens.push_back({std::move(text), score, attr});
}

void add_merge(Vocab& v, std::string_view line, int rank) {
  // llama.cpp splits at the first space after the first byte; a line with none is ("", "").
  const size_t pos = line.find(' ', 1);
  std::string key = pos == std::string_view::npos
                        ? std::string(" ")
                        : std::string(line.substr(0, pos)) + ' ' + std::string(line.substr(pos + 1));
  v.bpe_ranks.emplace(std::move(key), rank);
}

int Vocab::bpe_rank(std::string_view left, std::string_view right, std::string& scratch) const {
  scratch.assign(left);
  scratch.push_back(' ');
  scratch.append(right);
  auto it = bpe_ranks.find(std::string_view(scratch));
  return it == bpe_ranks.end() ? -1 : it->second;
}

int32_t Vocab::byte_to_token(uint8_t byte) const {
  if (type == VocabType::kSpm || !byte_encode) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const char buf[6] = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
    const int32_t id = find(std::string_view(buf, 6));
    if (id != kNoToken || type != VocabType::kSpm) return id;
    return find(std::string_view(reinterpret_cast<const char*>(&byte), 1));
  }
  return find(byte_to_unicode(byte));
}

void set_type_defaults(Vocab& v, std::string_view model, std::string_view pre) {
  v.model_name = model;
  v.pre_name = pre;
  if (model == "llama") {
    v.type = VocabType::kSpm;
    v.bos = 1, v.eos = 2, v.unk = 0;
    v.add_space_prefix = true, v.clean_spaces = false, v.add_bos = true, v.add_eos = false;
    return;
  }
  if (model == "bert") {
    v.type = VocabType::kWpm;
    v.bos = 101, v.unk = 100, v.sep = 102, v.pad = 0, v.mask = 103;
    v.add_space_prefix = false, v.clean_spaces = true, v.add_bos = true, v.add_sep = true;
    return;
  }
  if (model != "gpt2" && model != "gemma4") fail("unsupported tokenizer model '{}'", model);
  v.type = VocabType::kBpe;
  if (model == "gpt2") v.bos = 11, v.eos = 11;
  if (model == "gemma4") v.pre_name = "gemma4";
  v.add_space_prefix = false, v.escape_whitespaces = false, v.clean_spaces = true;
  const std::string_view name = v.pre_name.empty() ? std::string_view("default") : v.pre_name;
  const PreRule* rule = nullptr;
  for (const PreRule& r : kPreRules)
    if (is_one_of(name, r.names)) rule = &r;
  if (!rule) fail("unknown pre-tokenizer type: '{}'", name);
  v.clean_spaces = rule->clean_spaces;
  const std::string_view kind = rule->kind;
  if (kind == "llama3" && !is_one_of(name, {"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"})) {
    v.ignore_merges = true, v.add_bos = true;
  }
  if (is_one_of(name, {"chatglm-bpe", "glm4"})) v.bos = kNoToken;
  if (kind == "tekken") v.ignore_merges = true, v.add_bos = true;
  if (is_one_of(name, {"jina-v1-en", "jina-v2-code", "roberta-bpe"})) v.add_sep = true;
  if (kind == "gemma4") v.escape_whitespaces = true, v.byte_encode = false;
  v.pre_name = std::string(name);
  v.pre = PreTokenizer::create(kind, v.byte_encode);
}

void finish_vocab(Vocab& v, std::string_view general_name) {
  FRINK_ASSERT(v.token_to_id.size() == v.tokens.size());
  if (v.pre_name == "gemma4") v.add_bos = true;  // llama.cpp PR #21500
  detect_special_by_text(v);
  for (TokenData& t : v.tokens)  // control tokens named "unused" are unused (llama.cpp)
    if ((t.attr & kAttrControl) && t.text.find("unused") != std::string::npos) t.attr |= kAttrUnused;
  build_eog(v);

  v.special_tokens.clear();
  for (int32_t id = 0; id < v.n_tokens(); ++id)
    if (v.tokens[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) v.special_tokens.push_back(id);
  std::stable_sort(v.special_tokens.begin(), v.special_tokens.end(), [&](int32_t a, int32_t b) {
    return v.tokens[a].text.size() > v.tokens[b].text.size();
  });

  v.pieces.resize(v.tokens.size());
  for (int32_t id = 0; id < v.n_tokens(); ++id) v.pieces[id] = piece_for(v, id);
  set_strip_attrs(v, general_name);
}

}  // namespace frink::tok
