// The regex lists are llama.cpp's (llama-vocab.cpp, llm_tokenizer_bpe's constructor), copied
// as written there, including its rewrites of HF's "(?i:...)" contractions. llama.cpp runs
// them through hand-written matchers (gpt2, llama3) or std::regex over a category-collapsed
// copy of the text; PCRE2 with UCP gives the same splits on the shared test vectors without
// either trick.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenize.h"

#include <pcre2.h>

#include <map>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace frink::tok {

namespace {

// GPT-2's pattern; also the last stage of falcon, starcoder and default.
constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kPoro = " ?[^(\\s|.,!?…。，、।۔،)]+";
constexpr const char* kTekkenWords =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kContractions = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

const std::map<std::string_view, std::vector<std::string>>& regex_table() {
  static const std::map<std::string_view, std::vector<std::string>> kTable = {
      {"default",
       {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}},
      {"gpt2", {kGpt2}},
      {"llama3", {kLlama3}},
      {"qwen2", {kQwen2}},
      {"qwen35",
       {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?"
        "[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {"deepseek-llm",
       {"[\r\n]",
        "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"}},
      {"deepseek-v3",
       {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
        " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
      {"deepseek-coder",
       {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}},
      {"falcon",
       {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"}},
      {"starcoder", {"\\p{N}", kGpt2}},
      {"poro", {kPoro}},
      {"viking", {kPoro, "\\p{N}"}},
      {"tekken", {kTekkenWords}},
      {"gpt4o",
       {std::string("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+") +
        kContractions + "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" +
        kContractions + "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {"seed-coder",
       {std::string(kContractions) + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}|"
        " ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {"bailingmoe",
       {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
      {"gemma4", {"[^\\n]+|[\\n]+"}},
      {"whitespace", {"\\S+"}},
  };
  return kTable;
}

}  // namespace

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::~PreTokenizer() = default;

std::shared_ptr<const PreTokenizer> PreTokenizer::create(std::string_view kind, bool byte_encode) {
  const auto& table = regex_table();
  auto it = table.find(kind);
  if (it == table.end()) fail("unsupported pre-tokenizer kind '{}'", kind);
  std::shared_ptr<PreTokenizer> p(new PreTokenizer());
  p->exprs_ = it->second;
  p->byte_encode_ = byte_encode;
  for (const auto& expr : p->exprs_) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // DOLLAR_ENDONLY: "\s+$" must mean end of text, as in std::regex (ECMAScript).
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(expr.data()), expr.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off,
                                     nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("pre-tokenizer regex '{}' does not compile at {}: {}", expr, err_off,
           reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: matching falls back to the interpreter
    auto c = std::make_unique<Compiled>();
    c->code = code;
    p->compiled_.push_back(std::move(c));
  }
  return p;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& out) const {
  if (text.empty()) return;
  // Valid UTF-8 for PCRE: llama.cpp's lenient decoding, re-encoded; surrogates (which
  // llama.cpp would pass through) become U+FFFD too, since PCRE2 refuses them.
  std::string subject;
  subject.reserve(text.size());
  for (uint32_t cpt : decode_utf8(text)) {
    if ((cpt >= 0xD800 && cpt <= 0xDFFF) || cpt > 0x10FFFF) cpt = 0xFFFD;
    append_utf8(subject, cpt);
  }

  struct Piece { size_t begin, end; };  // byte range [begin, end) of `subject`
  std::vector<Piece> pieces{{0, subject.size()}}, next;
  const auto* base = reinterpret_cast<PCRE2_SPTR>(subject.data());
  for (const auto& c : compiled_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(c->code, nullptr);
    next.clear();
    for (const Piece& p : pieces) {
      const size_t len = p.end - p.begin;
      size_t pos = 0, last = 0;
      while (pos < len) {
        const int rc = pcre2_match(c->code, base + p.begin, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // an empty match splits nothing; step one character
          pos = me + utf8_len(subject[p.begin + me]);
          continue;
        }
        if (ms > last) next.push_back({p.begin + last, p.begin + ms});
        next.push_back({p.begin + ms, p.begin + me});
        last = pos = me;
      }
      if (last < len) next.push_back({p.begin + last, p.end});
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }

  for (const Piece& p : pieces) {
    std::string word;
    if (byte_encode_) {
      word.reserve((p.end - p.begin) * 2);
      for (size_t i = p.begin; i < p.end; ++i) word += byte_to_unicode(static_cast<uint8_t>(subject[i]));
    } else {
      word.assign(subject, p.begin, p.end - p.begin);
    }
    out.push_back(std::move(word));
  }
}

}  // namespace frink::tok
