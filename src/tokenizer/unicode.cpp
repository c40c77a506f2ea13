#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace frink::tok {

namespace detail {
extern const CptRange kCptRanges[];
extern const size_t kNumCptRanges;
extern const CptPair kLowercase[];
extern const size_t kNumLowercase;
extern const CptPair kNfdFirst[];
extern const size_t kNumNfdFirst;
}  // namespace detail

namespace {

// Decodes one codepoint at s[*pos] exactly as llama.cpp's unicode_cpt_from_utf8 (no check for
// overlong forms or surrogates); returns false, moving nothing, on an invalid sequence.
bool decode_one(std::string_view s, size_t* pos, uint32_t* cpt) {
  const size_t i = *pos;
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const uint8_t c = b(0);
  if (!(c & 0x80)) { *cpt = c; *pos += 1; return true; }
  if (!(c & 0x40)) return false;
  if (!(c & 0x20)) {
    if (!cont(1)) return false;
    *cpt = ((c & 0x1Fu) << 6) | (b(1) & 0x3Fu); *pos += 2; return true;
  }
  if (!(c & 0x10)) {
    if (!cont(1) || !cont(2)) return false;
    *cpt = ((c & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu); *pos += 3; return true;
  }
  if (!(c & 0x08)) {
    if (!cont(1) || !cont(2) || !cont(3)) return false;
    *cpt = ((c & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    *pos += 4; return true;
  }
  return false;
}

uint32_t lookup_pair(const CptPair* table, size_t n, uint32_t cpt) {
  const CptPair* end = table + n;
  const CptPair* it = std::lower_bound(table, end, cpt,
                                       [](const CptPair& p, uint32_t v) { return p.cpt < v; });
  return (it != end && it->cpt == cpt) ? it->mapped : cpt;
}

struct ByteMaps {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 324> from_unicode;  // every GPT-2 codepoint is below 256 + 68
  ByteMaps() {
    from_unicode.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cpt = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      append_utf8(to_unicode[b], cpt);
      from_unicode[cpt] = static_cast<int16_t>(b);
    }
  }
};

const ByteMaps& byte_maps() {
  static const ByteMaps kMaps;
  return kMaps;
}

}  // namespace

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t cpt;
    if (decode_one(s, &pos, &cpt)) {
      out.push_back(cpt);
    } else {
      out.push_back(0xFFFD);
      ++pos;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt <= 0x7F) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | ((cpt >> 18) & 0x07)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

uint8_t cpt_flags(uint32_t cpt) {
  using detail::kCptRanges;
  const CptRange* end = kCptRanges + detail::kNumCptRanges;
  const CptRange* it = std::upper_bound(kCptRanges, end, cpt,
                                        [](uint32_t v, const CptRange& r) { return v < r.first; });
  return it == kCptRanges ? 0 : (it - 1)->flags;
}

uint32_t cpt_to_lower(uint32_t cpt) {
  return lookup_pair(detail::kLowercase, detail::kNumLowercase, cpt);
}

uint32_t cpt_nfd_first(uint32_t cpt) {
  // Hangul syllables decompose algorithmically (Unicode 3.12): L = 0x1100 + SIndex / 588.
  if (cpt >= 0xAC00 && cpt <= 0xD7A3) return 0x1100 + (cpt - 0xAC00) / 588;
  return lookup_pair(detail::kNfdFirst, detail::kNumNfdFirst, cpt);
}

const std::string& byte_to_unicode(uint8_t b) { return byte_maps().to_unicode[b]; }

int unicode_to_byte(uint32_t cpt) {
  return cpt < byte_maps().from_unicode.size() ? byte_maps().from_unicode[cpt] : -1;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<uint8_t>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;            // continuation byte: keep looking back
    if (c >= 0xC0 && utf8_len(static_cast<char>(c)) > back) return n - back;  // incomplete
    return n;                                    // ASCII or a complete sequence
  }
  return n;
}

}  // namespace frink::tok
