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
#include <optional>
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

  // Throws frink::Error naming a parameter that is NaN or infinite (the Sampler checks too).
  void check() const;
};

struct TokenLogit {
  int32_t id;
  float logit;
};

// The stages, one function each, exposed so tests can check them alone. Each edits `cands`
// in place and leaves at least one candidate when it got one.
namespace sampling {

// Sums of exps over a candidate list (top-p's mass, the draw's) are taken in chunks of
// kSumChunk consecutive candidates: each chunk's terms in order, then the chunks' sums in
// order, so a device can sum the chunks of a whole vocabulary in parallel and agree bit for
// bit (cuda/pick.cu). A list of at most kSumChunk is one sum in order.
inline constexpr size_t kSumChunk = 256;

// Descending by logit, ties by ascending id, so every stage is deterministic.
void sort_desc(std::vector<TokenLogit>& cands);
// Keeps the k highest (sorted) when 0 < k < size.
void top_k(std::vector<TokenLogit>& cands, int k);
// Keeps the smallest sorted prefix whose softmax mass reaches p (p >= 1: off); the mass through
// a candidate is taken by chunks (kSumChunk), as finish's.
void top_p(std::vector<TokenLogit>& cands, float p);
// Keeps logit >= max_logit + log(p), i.e. prob >= p * max prob (p <= 0: off).
void min_p(std::vector<TokenLogit>& cands, float p);
// The chain after top-k: top_p, min_p, logits divided by temp (> 0), then the token at
// uniform u in [0, 1) along the softmax's cumulative mass (llama_sample_dist), the last
// candidate taking any rounding remainder. The mass before a candidate is the sum of the
// earlier chunks' sums plus its chunk's terms up to it (kSumChunk). A device finishing a
// sample (cuda/pick.cu) does this arithmetic in this order.
int32_t finish(std::vector<TokenLogit>& cands, float top_p, float min_p, float temp, double u);
// Index into `cands` of the highest logit, first one on ties.
size_t argmax(const std::vector<TokenLogit>& cands);
// llama_sampler_penalties_apply for a token seen `count` times in the window: logit <= 0 ?
// logit * repeat : logit / repeat, then minus (count * frequency + presence). Every operation
// rounded on its own (sampler.cpp builds with -ffp-contract=off), so a device can match it bit
// for bit (cuda/pick.cu) whatever the host compiler would fuse.
float penalized(float logit, int count, float repeat, float frequency, float presence);

}  // namespace sampling

// Greedy decoding: the index of the largest of n logits, the lowest id on ties (what
// Sampler::sample returns at temp <= 0 without penalties).
int32_t greedy_token(const float* logits, int64_t n);

// The chain after top-k as a device runs it (sampling::finish's parameters), with the uniform
// draws of this step and of the next, so the next step can be drawn before the host sees this
// one's token (a decode step enqueued ahead).
struct DeviceDraw {
  float top_p = 1.0f, min_p = 0.0f;
  float log_min_p = 0.0f;  // std::log(min_p), as sampling::min_p rounds it (min_p > 0)
  float temp = 1.0f;
  double u = 0.0, u_next = 0.0;
};

// Sampler::sample as a device can do it next to the logits, so they need not cross to the
// host: the penalties, then the argmax (top_k == 0: a greedy sample), or the top_k best
// candidates (logit descending, id ascending: sampling::top_k's order) finished by `draw`,
// or (whole_vocab: top-k off) `draw` over every logit. The caller hands the device's token
// to Sampler::take_device_draw.
//
// whole_vocab: a device decides the chain from its best few candidates where they hold every
// survivor (top-p's cut among them, or fewer min-p survivors than them), and from every
// logit's exps where nothing cuts (top-p and min-p off); otherwise by sorting the vocabulary.
//
// Penalties: penalize says they are on (a window and a penalty that changes logits), even while
// the window is empty; pen_ids / pen_counts are the window's tokens and counts. A device that
// picks this step's token itself may start the next step before the caller accepts it: that
// step's window is this one's with the token entering and pen_leaving (the window's oldest,
// when it is full; -1 otherwise) leaving (penalties_after checks it against the next pick).
struct DevicePick {
  int top_k = 0;
  bool whole_vocab = false;
  bool penalize = false;
  std::vector<int32_t> pen_ids, pen_counts;  // tokens in the penalty window and their counts
  int32_t pen_leaving = -1;
  float repeat = 1.0f, frequency = 0.0f, presence = 0.0f;
  DeviceDraw draw;  // top_k > 0 or whole_vocab

  // Whether next's penalties are this pick's after `entering` joined the window (and
  // pen_leaving left it): the same parameters and the same tokens with the same counts, in any
  // order.
  bool penalties_after(const DevicePick& next, int32_t entering) const;
};

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
  // What a device may do of the next sample() (see DevicePick); none when top-k is not below
  // the vocabulary.
  std::optional<DevicePick> device_pick() const;
  // The token a device picked with device_pick(): a draw at temp > 0 used this step's
  // uniform, which the sampler moves past, as sample() would have.
  int32_t take_device_draw(int32_t token);

 private:
  void apply_penalties(std::vector<TokenLogit>& cands) const;
  double rng_uniform();   // the RNG's next draw in [0, 1)
  double take_uniform();  // this step's draw: uniform_[0], then one more from the RNG

  SamplerParams params_;
  int n_vocab_;
  std::mt19937 rng_;
  // The next two uniform draws, taken from rng_ in order, so device_pick can hand a device
  // the next step's as well: the stream of draws is the same whoever uses them.
  double uniform_[2] = {0.0, 0.0};
  std::deque<int32_t> history_;                // the penalty window, oldest first
  std::unordered_map<int32_t, int> counts_;    // occurrences of each token in history_
  std::vector<TokenLogit> cands_;              // scratch, [n_vocab] at the start of sample()
};

}  // namespace frink
