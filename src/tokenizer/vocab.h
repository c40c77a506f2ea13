// A tokenizer's vocabulary: token texts, scores and attributes, the special ids, the flags
// that steer encoding, and BPE merge ranks, with exactly llama.cpp's meaning (llama-vocab.cpp,
// llama_vocab::impl). Filled by a loader (gguf_vocab.cpp, hf_tokenizer_json.cpp,
// gpt2_files.cpp), then finish_vocab() derives what llama.cpp derives after loading: the
// auto-detected EOT/EOM/FIM ids, the end-of-generation set, the special-token list and the
// piece cache. Invariant after finish_vocab(): token_to_id.size() == tokens.size().
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace frink::tok {

class PreTokenizer;

inline constexpr int32_t kNoToken = -1;

enum class VocabType { kSpm, kBpe, kWpm };

// llama_token_attr bits.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0, kAttrUnknown = 1u << 0, kAttrUnused = 1u << 1, kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3, kAttrUserDefined = 1u << 4, kAttrByte = 1u << 5,
  kAttrNormalized = 1u << 6, kAttrLstrip = 1u << 7, kAttrRstrip = 1u << 8,
  kAttrSingleWord = 1u << 9,
};

// GGUF tokenizer.ggml.token_type values (llama_token_type) mapped to attributes.
uint32_t attr_from_token_type(int64_t token_type);

struct TokenData {
  std::string text;
  float score = 0.0f;
  uint32_t attr = kAttrNormal;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct Vocab {
  VocabType type = VocabType::kSpm;
  std::string model_name;    // tokenizer.ggml.model
  std::string pre_name;      // tokenizer.ggml.pre ("" when absent)
  std::vector<TokenData> tokens;
  TokenMap token_to_id;
  // BPE merges: "left right" -> rank (the merge's line index); left and right split at the
  // first space after the first byte, as llama.cpp does.
  TokenMap bpe_ranks;
  int max_token_len = 0;     // bytes

  int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken;
  int32_t sep = kNoToken, pad = kNoToken, mask = kNoToken;
  int32_t fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken, fim_pad = kNoToken;
  int32_t fim_rep = kNoToken, fim_sep = kNoToken;

  bool add_space_prefix = false;
  bool add_bos = false, add_eos = false, add_sep = false;
  bool ignore_merges = false;       // BPE: a whole pre-token that is a token skips merging
  bool clean_spaces = false;        // decode: clean_up_tokenization_spaces
  bool escape_whitespaces = true;   // ' ' <-> U+2581
  bool byte_encode = true;          // BPE: GPT-2 byte-level text
  bool lowercase = true, strip_accents = true;  // WordPiece normaliser

  std::set<int32_t> eog_ids;
  std::vector<int32_t> special_tokens;  // CONTROL | USER_DEFINED | UNKNOWN, longest text first
  std::vector<std::string> pieces;      // token_to_piece(id, special = true)
  std::shared_ptr<const PreTokenizer> pre;  // BPE only

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t find(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? kNoToken : it->second;
  }
  int bpe_rank(std::string_view left, std::string_view right, std::string& scratch) const;
  int32_t byte_to_token(uint8_t byte) const;  // kNoToken when the vocabulary has none
};

// Appends token `text` (with `score`, `attr`) as the next id; an empty text becomes
// "[EMPTY_<id>]" and a duplicate throws, both as in llama.cpp.
void add_token(Vocab& v, std::string text, float score, uint32_t attr);
void add_merge(Vocab& v, std::string_view merge_line, int rank);

// Applies llama.cpp's per-type defaults for special ids and flags; call before reading the
// file's own keys. Throws on an unknown pre-tokenizer name (BPE).
void set_type_defaults(Vocab& v, std::string_view model, std::string_view pre);
// Derives EOT/EOM/FIM/EOG, the special-token list and the piece cache; builds the
// pre-tokenizer. Call once, after every token and key is in.
void finish_vocab(Vocab& v, std::string_view general_name);

}  // namespace frink::tok
