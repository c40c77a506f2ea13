// Host sampling over a Llama-3 vocabulary (128256 logits): the Sampler's whole chain per
// token, as frink run pays it where the device hands the logits back (top-k off with more
// survivors than the device's 256 candidates) or on the CPU path. Peaked logits (a few far
// above the rest, as a trained model's usually are) and flat ones (a random-weight synth
// model's, or a high-entropy position): top-p then has to order most of the vocabulary.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"

namespace {

constexpr int kVocab = 128256;

std::vector<float> logits(bool peaked) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, peaked ? 1.0f : 0.3f);
  std::vector<float> l(kVocab);
  for (float& v : l) v = g(rng);
  if (peaked)
    for (int i = 0; i < 12; ++i) l[static_cast<size_t>((i * 7919 + 5) % kVocab)] = 20.0f - 0.5f * float(i);
  return l;
}

void run(benchmark::State& state, frink::SamplerParams p) {
  const std::vector<float> l = logits(state.range(0) != 0);
  frink::Sampler s(p, kVocab);
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(l.data()));
  state.SetLabel(state.range(0) ? "peaked" : "flat");
}

// llama.cpp's defaults with top-k off.
void BM_TopKOff(benchmark::State& state) { run(state, {.temp = 0.8f, .top_k = 0, .top_p = 0.95f, .min_p = 0.05f}); }
// vLLM's usual: top-p alone.
void BM_TopPOnly(benchmark::State& state) { run(state, {.temp = 0.8f, .top_k = 0, .top_p = 0.95f, .min_p = 0.0f}); }
// Temperature alone: the draw over every token.
void BM_TemperatureOnly(benchmark::State& state) {
  run(state, {.temp = 0.8f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f});
}
// llama.cpp's defaults.
void BM_TopK40(benchmark::State& state) { run(state, {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f}); }

BENCHMARK(BM_TopKOff)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TopPOnly)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TemperatureOnly)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TopK40)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
