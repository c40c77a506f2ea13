// Perplexity as llama-perplexity computes it (tools/perplexity/perplexity.cpp, perplexity()):
// the text is tokenized once (BOS added when the vocabulary asks for it), cut into
// non-overlapping windows of n_ctx tokens, and each window runs from an empty context with its
// first token replaced by BOS (when the vocabulary adds BOS). Only the second half is scored:
// the logits at positions [n_ctx/2, n_ctx - 1) predict the token after each, so a window
// scores n_ctx - 1 - n_ctx/2 tokens. PPL = exp(mean NLL); its error is llama.cpp's,
// ppl * sqrt((E[nll^2] - E[nll]^2) / (n - 1)).
//
// KL-divergence mode, like llama-perplexity's --kl-divergence-base / --kl-divergence:
// kl_base_out saves the tokens and the scored log-probabilities; kl_in reads such a file
// (its tokens and n_ctx replace the caller's) and compares this model against it.
//
// KL base file (little-endian), "FRINKKLD" version 1:
//   char  magic[8]  = "FRINKKLD"
//   u32   version   = 1
//   u32   n_ctx, n_vocab, n_chunk, first (= n_ctx / 2), reserved (0)
//   i32   tokens[n_chunk * n_ctx]                 the windows, before BOS replacement
//   then per chunk, per scored position j in [first, n_ctx - 1), one row:
//   f32   min_lp, scale;  u16 q[n_vocab]         log p_i ~= min_lp + scale * q_i
// min_lp = max(row minimum, row maximum - 32) (lower log-probs clamp to it) and
// scale = (max - min_lp) / 65535, so a row costs 2 * n_vocab + 8 bytes (half of f32) and a
// log-prob is off by at most scale / 2 (2.5e-4 nats). Readers renormalise each row.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/decoder.h"
#include "model/model.h"

namespace frink {

class Tokenizer;

struct PerplexityParams {
  int64_t n_ctx = 512;
  int64_t n_batch = 2048;     // tokens per eval; clamped to n_ctx
  int n_threads = 0;          // 0: one per core
  DeviceChoice device = DeviceChoice::kCpu;
  int64_t n_gpu_layers = -1;  // DecoderOptions::n_gpu_layers
  int64_t n_chunks = -1;      // < 0: every whole window of the text
  std::string kl_base_out;    // write the KL base file here
  std::string kl_in;          // compare against this KL base file
};

struct KlStats {
  int64_t n = 0;              // scored tokens
  double kld_mean = 0, kld_err = 0;        // mean KL(base || this model) per token, nats
  double same_top = 0, same_top_err = 0;   // fraction of tokens whose argmax agrees
  double ppl_base = 0;        // perplexity of the base log-probs on the same tokens
};

struct PerplexityResult {
  std::vector<double> chunk_ppl;  // running estimate after each window
  int64_t n_scored = 0;
  double nll_mean = 0;
  double ppl = 0, ppl_err = 0;
  std::optional<KlStats> kl;
};

// llama-perplexity's tokenization: BOS per the vocabulary, special tokens not parsed.
std::vector<int32_t> perplexity_tokens(const Tokenizer& tok, const std::string& text);

// `bos` replaces each window's first token when >= 0 (pass tok.bos() when tok.add_bos()).
// on_chunk(i, running_ppl) runs after window i (0-based). Throws frink::Error when the text
// is shorter than two windows, or a KL base file is malformed or was made for another vocab.
PerplexityResult run_perplexity(const Model& m, std::vector<int32_t> tokens, int32_t bos, const PerplexityParams& p,
                                const std::function<void(int64_t, double)>& on_chunk = nullptr);

// "Final estimate: PPL = 12.3456 +/- 0.12345", llama-perplexity's closing line.
std::string perplexity_final_line(const PerplexityResult& r);

}  // namespace frink
