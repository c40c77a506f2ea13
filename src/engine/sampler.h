// Token sampling in llama.cpp's default order (common/sampling.cpp, src/llama-sampling.cpp):
//
//   penalties -> top-k -> top-p -> min-p -> temperature -> seeded draw
//
// with llama.cpp's semantics, which surprise in two places:
//  - top-p and min-p see the PENALISED logits at temperature 1; temperature only reshapes
//    what survives them, so `--temp 5 --top-p 0.5` still keeps the top half of the mass.
//  - the repetition penalty divides a positive logit and MULTIPLIES a non-positive one (the
//    paper only divided, which would make negative-logit tokens more likely).
// temp <= 0 is greedy: argmax of the penalised logits, ties to the lowest token id.
// Every stage keeps at least one candidate (llama.cpp's min_keep = 1).
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <unordered_map>
#include <vector>

namespace frink {

struct SamplerParams {
  float temp = 0.8f;               // <= 0: greedy
  int top_k = 40;                  // <= 0: off
  float top_p = 0.95f;             // >= 1: off
  float min_p = 0.05f;             // <= 0: off; keeps p_i >= min_p * max_j p_j
  float repeat_penalty = 1.0f;     // 1: off
  float presence_penalty = 0;      // subtracted once from a token seen in the window
  float frequency_penalty = 0;     // subtracted once per occurrence in the window
  int penalty_last_n = 64;         // window of accepted tokens; 0: off; < 0: all since reset()
  int64_t seed = -1;               // -1 (any negative): seeded from std::random_device
};

struct TokenLogit {
  int32_t id;
  float logit;
};

// The stages, one function each, exposed so tests can check them alone. Each edits `cands`
// in place and leaves at least one candidate when it got one.
namespace sampling {

// Descending by logit, ties by ascending id, so every stage is deterministic.
void sort_desc(std::vector<TokenLogit>& cands);
// Keeps the k highest (sorted) when 0 < k < size.
void top_k(std::vector<TokenLogit>& cands, int k);
// Keeps the smallest sorted prefix whose softmax mass reaches p (p >= 1: off).
void top_p(std::vector<TokenLogit>& cands, float p);
// Keeps logit >= max_logit + log(p), i.e. prob >= p * max prob (p <= 0: off).
void min_p(std::vector<TokenLogit>& cands, float p);
// Index into `cands` of the highest logit, first one on ties.
size_t argmax(const std::vector<TokenLogit>& cands);

}  // namespace sampling

// Greedy decoding: the index of the largest of n logits, the lowest id on ties (what
// Sampler::sample returns at temp <= 0 without penalties).
int32_t greedy_token(const float* logits, int64_t n);

class Sampler {
 public:
  // n_vocab: the length of every logits row passed to sample().
  explicit Sampler(SamplerParams params, int n_vocab);

  // logits: [n_vocab] for the next position. Does not record the token: call accept().
  int32_t sample(const float* logits);
  // Records a token that entered the context (prompt or generated) for the penalties.
  void accept(int32_t token);
  // Forgets the penalty history and restarts the RNG from the seed, so a fixed seed
  // replays the same draws (a random seed draws a new one).
  void reset();

  const SamplerParams& params() const { return params_; }
  // sample() is greedy_token of the raw logits (temp <= 0, no penalty in effect): the caller
  // may then let the decoder pick the token (Decoder::eval_greedy) and skip the logits.
  bool greedy() const;

 private:
  void apply_penalties(std::vector<TokenLogit>& cands) const;
  int32_t draw(std::vector<TokenLogit>& cands);

  SamplerParams params_;
  int n_vocab_;
  std::mt19937 rng_;
  std::deque<int32_t> history_;                // the penalty window, oldest first
  std::unordered_map<int32_t, int> counts_;    // occurrences of each token in history_
  std::vector<TokenLogit> cands_;              // scratch, [n_vocab] at the start of sample()
};

}  // namespace frink
