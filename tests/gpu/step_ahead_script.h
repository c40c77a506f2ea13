// The script the step-ahead tests run (DeviceTokenGraph in model_parity_test.cpp for attention
// models, HybridDevice in delta_net_test.cpp for hybrids): once with decode steps
// enqueued one ahead (CudaBackend::run_token) and once with every step run only when asked,
// expecting the same bits, through everything that must drop a step ahead or may adopt it:
// a long run of decode steps (greedy, or drawn with one seeded sampler shared by both
// sequences, its penalty window taking every token fed), the caller's own token instead of
// the pick, a rewind of 3 tokens, a logits step (a new batch), the session assigned from a
// copy of itself, two sequences taking turns.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/decoder.h"
#include "engine/rewind.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"

namespace frink::test {

struct StepScript {
  int prompt = 0;           // prompt tokens, the parity tests' pattern
  int first = 0, last = 0;  // decode steps at the start and at the end
  SamplerParams sampling{.temp = 0.0f};  // how each decode step picks (greedy by default)
};

struct StepScriptRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  int64_t ahead = 0, steps = 0;
};

inline StepScriptRun run_step_script(const Model& m, DecoderOptions o, const StepScript& sc, bool step_ahead) {
  const int64_t V = m.hp.n_vocab;
  o.hooks.no_step_ahead = !step_ahead;
  Decoder dec(m, o);
  Sampler sampler(sc.sampling, static_cast<int>(V));
  Session a(m, 0), b(m, 0);
  std::vector<int32_t> prompt;
  for (int i = 0; i < sc.prompt; ++i) prompt.push_back(static_cast<int32_t>((1 + 7 * i * i + 3 * i) % V));
  StepScriptRun r;
  std::vector<float> logits;
  dec.eval(a, prompt, false, logits);
  int32_t t = greedy_token(logits.data(), V);
  // The sampler's window takes each token fed, as a caller's does (its penalties, where on).
  const auto steps = [&](Session& s, int n) {
    for (int i = 0; i < n; ++i) {
      sampler.accept(t);
      r.tokens.push_back(t = dec.eval_next(s, t, sampler));
    }
  };
  steps(a, sc.first);
  t = static_cast<int32_t>((t + 1) % V);  // the caller's own token, not the pick: the step ahead is dropped
  steps(a, 3);
  // Fewer rows than the step ahead was enqueued for (a recurrent state back to its snapshot,
  // the rest replayed as a batch).
  rewind_session(dec, a, a.n_past() - 3);
  steps(a, 4);
  dec.eval(a, {t}, false, logits);  // a logits step (a new batch) drops it too
  r.logits.insert(r.logits.end(), logits.begin(), logits.end());
  t = greedy_token(logits.data(), V);
  steps(a, 3);
  // The same rows at the same length: a step ahead stays valid for the caches; a recurrent
  // state's copy pulls it, and assigning it back makes every device copy stale.
  const Session saved = a;
  a = saved;
  steps(a, 3);
  dec.eval(b, {3, 1, 4, 1, 5}, false, logits);
  int32_t tb = greedy_token(logits.data(), V);
  for (int i = 0; i < 4; ++i) {  // two sequences taking turns: each call drops the other's step
    steps(a, 1);
    sampler.accept(tb);
    r.tokens.push_back(tb = dec.eval_next(b, tb, sampler));
  }
  steps(a, sc.last);
  r.ahead = dec.steps_run_ahead();
  r.steps = dec.whole_token_steps();
  return r;
}

// Both ways bit for bit, no step ahead when none was asked for, and more than min_ahead of
// the steps run ahead.
inline void expect_steps_ahead_equal_asked(const Model& m, const DecoderOptions& o, const StepScript& sc,
                                           const std::string& what, int64_t min_ahead) {
  const StepScriptRun ahead = run_step_script(m, o, sc, true), asked = run_step_script(m, o, sc, false);
  std::printf("[gpu] %s: %lld of %lld steps ran ahead\n", what.c_str(), static_cast<long long>(ahead.ahead),
              static_cast<long long>(ahead.steps));
  EXPECT_EQ(ahead.tokens, asked.tokens) << what;
  EXPECT_EQ(ahead.logits, asked.logits) << what;
  EXPECT_EQ(asked.ahead, 0) << what;
  EXPECT_EQ(ahead.steps, asked.steps) << what;
  EXPECT_GT(ahead.ahead, min_ahead) << what;
}

}  // namespace frink::test
