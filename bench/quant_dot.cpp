// vec_dot_rows over a 2048 x 2048 weight matrix per type, scalar reference vs the SIMD
// level the dispatcher picked (and AVX2 explicitly where the CPU has more), reported as
// GB/s of weight bytes read: a decode-time matvec is a pass over the weights, so this is
// the number to hold against the machine's memory bandwidth. One thread; the activation
// is quantized once outside the timed loop, as the CPU matmul does per input row.
// Results are validated against the scalar reference before timing.
//
// vec_dot_tile/*: the prompt-time product, the same matrix against kTokens activation rows,
// reported as GFLOP/s (2 * rows * cols * tokens per call): "tile" is vec_dot_tile (each
// weight block decoded once for several tokens), "rows" the pre-tile way (vec_dot_rows
// once per token), "avx2" the AVX2 tile where the CPU has more. Validated bit-exact
// against vec_dot_rows per token first.
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/quant.h"
#include "quant/simd_kernels.h"
#include "../tests/quant/random_blocks.h"

namespace {

using namespace frink;
constexpr int64_t kRows = 2048, kCols = 2048;

struct Matrix {
  std::vector<uint8_t> w, act;
  size_t row_bytes = 0;
};

const Matrix& matrix(GgmlType t) {
  static std::vector<std::pair<GgmlType, Matrix>> cache;  // bench-local, built once per type
  for (auto& [type, m] : cache)
    if (type == t) return m;
  std::mt19937 rng(static_cast<unsigned>(t) + 1);
  Matrix m;
  m.row_bytes = ggml_row_bytes(t, kCols);
  for (int64_t r = 0; r < kRows; ++r) {
    const auto row = test::random_weight_row(rng, t, kCols);
    m.w.insert(m.w.end(), row.begin(), row.end());
  }
  const auto x = test::random_floats(rng, kCols);
  m.act.resize(ggml_row_bytes(vec_dot_type(t), kCols));
  quantize_row(vec_dot_type(t), x.data(), m.act.data(), kCols);
  cache.emplace_back(t, std::move(m));
  return cache.back().second;
}

enum Mode { kScalar = 0, kDispatched = 1, kAvx2 = 2 };

void BM_vec_dot_rows(benchmark::State& state, GgmlType t, Mode mode) {
  const Matrix& m = matrix(t);
  std::vector<float> out(kRows), ref(kRows);
  const bool was = force_scalar_kernels(true);
  vec_dot_rows(t, m.w.data(), m.row_bytes, kRows, m.act.data(), kCols, ref.data());
  force_scalar_kernels(mode == kScalar);
  const quant::SimdDot avx2 = quant::avx2_dot_kernel(t);
  if (mode == kAvx2 && (!avx2.rows || !__builtin_cpu_supports("avx2"))) {
    force_scalar_kernels(was);
    state.SkipWithError("no AVX2 kernel for this type");
    return;
  }
  auto run = [&] {
    if (mode == kAvx2) avx2.rows(m.w.data(), m.row_bytes, kRows, m.act.data(), kCols, out.data());
    else vec_dot_rows(t, m.w.data(), m.row_bytes, kRows, m.act.data(), kCols, out.data());
  };
  run();
  for (int64_t r = 0; r < kRows; ++r) {
    if (std::fabs(out[r] - ref[r]) > 1e-3f * (std::fabs(ref[r]) + 1.0f)) {
      force_scalar_kernels(was);
      state.SkipWithError("result differs from the scalar reference");
      return;
    }
  }
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(out.data());
  }
  force_scalar_kernels(was);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(m.w.size()));
  state.SetLabel(mode == kScalar ? "scalar" : mode == kAvx2 ? "avx2" : host_simd_level());
}

constexpr int64_t kTokens = 64;

// kTokens activation rows for type t's matrix (bench-local, built once per type).
const std::vector<uint8_t>& token_acts(GgmlType t) {
  static std::vector<std::pair<GgmlType, std::vector<uint8_t>>> cache;
  for (auto& [type, a] : cache)
    if (type == t) return a;
  std::mt19937 rng(static_cast<unsigned>(t) + 100);
  const size_t act_bytes = ggml_row_bytes(vec_dot_type(t), kCols);
  std::vector<uint8_t> a(act_bytes * kTokens);
  for (int64_t k = 0; k < kTokens; ++k) {
    const auto x = test::random_floats(rng, kCols);
    quantize_row(vec_dot_type(t), x.data(), a.data() + k * act_bytes, kCols);
  }
  cache.emplace_back(t, std::move(a));
  return cache.back().second;
}

enum TileMode { kTile = 0, kRowsPerToken = 1, kTileAvx2 = 2 };

void BM_vec_dot_tile(benchmark::State& state, GgmlType t, TileMode mode) {
  const Matrix& m = matrix(t);
  const std::vector<uint8_t>& a = token_acts(t);
  const size_t act_bytes = a.size() / kTokens;
  std::vector<float> out(kRows * kTokens), ref(kRows * kTokens);
  const quant::SimdDot avx2 = quant::avx2_dot_kernel(t);
  if (mode == kTileAvx2 && (!avx2.tile || !__builtin_cpu_supports("avx2"))) {
    state.SkipWithError("no AVX2 tile kernel for this type");
    return;
  }
  auto run = [&] {
    if (mode == kTile)
      vec_dot_tile(t, m.w.data(), m.row_bytes, kRows, a.data(), act_bytes, kTokens, kCols, out.data(), kRows);
    else if (mode == kTileAvx2)
      avx2.tile(m.w.data(), m.row_bytes, kRows, a.data(), act_bytes, kTokens, kCols, out.data(), kRows);
    else
      for (int64_t k = 0; k < kTokens; ++k)
        vec_dot_rows(t, m.w.data(), m.row_bytes, kRows, a.data() + k * act_bytes, kCols, out.data() + k * kRows);
  };
  for (int64_t k = 0; k < kTokens; ++k)
    vec_dot_rows(t, m.w.data(), m.row_bytes, kRows, a.data() + k * act_bytes, kCols, ref.data() + k * kRows);
  if (mode == kTileAvx2)  // the AVX2 tile matches the AVX2 rows kernel, not the dispatched one
    for (int64_t k = 0; k < kTokens; ++k)
      avx2.rows(m.w.data(), m.row_bytes, kRows, a.data() + k * act_bytes, kCols, ref.data() + k * kRows);
  run();
  if (out != ref) {
    state.SkipWithError("tile result differs from vec_dot_rows");
    return;
  }
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * kRows * kCols * kTokens, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(mode == kTileAvx2 ? "avx2" : host_simd_level());
}

void register_all() {
  for (GgmlType t : test::weight_types()) {
    const std::string name = "vec_dot_tile/" + std::string(ggml_type_name(t));
    benchmark::RegisterBenchmark((name + "/rows").c_str(), BM_vec_dot_tile, t, kRowsPerToken)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((name + "/tile").c_str(), BM_vec_dot_tile, t, kTile)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((name + "/avx2").c_str(), BM_vec_dot_tile, t, kTileAvx2)->Unit(benchmark::kMillisecond);
  }
  for (GgmlType t : test::weight_types()) {
    const std::string name = "vec_dot_rows/" + std::string(ggml_type_name(t));
    benchmark::RegisterBenchmark((name + "/scalar").c_str(), BM_vec_dot_rows, t, kScalar)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((name + "/avx2").c_str(), BM_vec_dot_rows, t, kAvx2)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((name + "/best").c_str(), BM_vec_dot_rows, t, kDispatched)->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
