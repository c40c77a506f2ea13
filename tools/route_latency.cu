// What one token's MoE routing costs as a step of a decode graph (issue 6): route_token
// (src/cuda/route_token.cuh) against main's before it (old_route_token, below), for 128, 256
// and 512 experts, each as a chain of kSteps launches in one CUDA graph (a token's kernels are
// such a chain), beside a chain of empty one-block kernels (the launch floor). Also checks that
// they give the same experts and weights, bit for bit. Built and run on the GPU machine by hand:
//   nvcc -O3 -arch=sm_90 -std=c++17 -Isrc tools/route_latency.cu -o /tmp/rl && /tmp/rl
#include <cstring>
#include <random>

#include "cuda/route_token.cuh"
#include "microbench.cuh"

using frink::cuda::RouteParams;

constexpr int kSteps = 1000;

__global__ void empty_kernel(int* v) {
  if (threadIdx.x == 0 && v[0] == 12345) v[1] = 1;
}

template <int kPer>
__global__ void warp_route(RouteParams p) {
  frink::cuda::route_token<kPer>(p, blockIdx.x, nullptr, true);
}

// main's route_token before the routing's end went a slot a lane (b0a23f5..71bccf5), to time
// and check the new one against.
namespace frink::cuda {
// The largest of a lane's keys, as a tree: the linear scan was a chain of kPer dependent
// 64-bit selects per top-k step (16 of them for a 512-expert router).
template <int kPer>
__device__ __forceinline__ uint64_t old_lane_max_key(const uint64_t (&key)[kPer]) {
  uint64_t m[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) m[i] = key[i];
#pragma unroll
  for (int w = 1; w < kPer; w *= 2)
#pragma unroll
    for (int i = 0; i + w < kPer; i += 2 * w) m[i] = m[i + w] > m[i] ? m[i + w] : m[i];
  return m[0];
}

// One warp routes token t, kPer experts a lane. slot_out (may be null): lane 0 writes the
// token's k (+ shared) slot experts there; store: lane 0 writes them and their weights to p.expert and p.weight.
template <int kPer>
__device__ __forceinline__ void old_route_token(const RouteParams& p, int64_t t, int32_t* slot_out, bool store) {
  const int lane = threadIdx.x % 32;
  const int E = static_cast<int>(p.n_expert);
  const float* lg = p.logits + t * (p.n_expert + (p.shared == 2));
  float prob[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    prob[i] = e < E ? lg[e] : -INFINITY;
  }
  if (p.gating == 0) {
    // softmax_inplace: max, exp (-inf -> 0), sum in double, times the float reciprocal
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPer; ++i) mx = fmaxf(mx, prob[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      prob[i] = prob[i] == -INFINITY ? 0.0f : expf(prob[i] - mx);
      sum += prob[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
    for (int i = 0; i < kPer; ++i) prob[i] *= inv;
  } else if (p.gating == 1) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) prob[i] = 1.0f / (1.0f + expf(-prob[i]));
  }
  uint64_t key[kPer];  // 0 for lanes past the experts: never chosen
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      const float s = p.sel_bias ? prob[i] + p.sel_bias[e] : prob[i];
      key[i] = rank_key(isnan(s) ? -INFINITY : s, e);  // a NaN score still yields a valid expert
    } else {
      key[i] = 0;
    }
  }
  float w[kMaxUsed];
  int chosen[kMaxUsed];
  const int k = static_cast<int>(p.k);
  for (int j = 0; j < k; ++j) {
    const uint64_t best = warp_max_key(old_lane_max_key(key));
    const int be = static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(best));
    float mine = 0.0f;  // the winner's lane holds its probability
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == be) {
        mine = prob[i];
        key[i] = 0;
      }
    chosen[j] = be;
    w[j] = __shfl_sync(0xffffffffu, mine, be % 32);
  }
  if (lane != 0) return;
  if (slot_out) {
    for (int j = 0; j < k; ++j) slot_out[j] = chosen[j];
    if (p.shared) slot_out[k] = E;
  }
  if (!store) return;
  if (p.gating == 2) {  // softmax over the chosen (softmax_inplace again)
    float mx = -INFINITY;
    for (int j = 0; j < k; ++j) mx = fmaxf(mx, w[j]);
    double sum = 0.0;
    for (int j = 0; j < k; ++j) {
      w[j] = w[j] == -INFINITY ? 0.0f : expf(w[j] - mx);
      sum += w[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = 0; j < k; ++j) w[j] *= inv;
  }
  if (p.norm_w) {
    double sum = 0.0;  // ggml_sum_rows accumulates in ggml_float
    for (int j = 0; j < k; ++j) sum += w[j];
    const float s = fmaxf(static_cast<float>(sum), kMinWeightSum);
    for (int j = 0; j < k; ++j) w[j] /= s;
  }
  if (p.w_scale != 0.0f && p.w_scale != 1.0f)
    for (int j = 0; j < k; ++j) w[j] *= p.w_scale;
  const int64_t slots = k + (p.shared != 0);
  for (int j = 0; j < k; ++j) {
    p.expert[t * slots + j] = chosen[j];
    p.weight[t * slots + j] = w[j];
  }
  if (p.shared) {
    p.expert[t * slots + k] = E;
    p.weight[t * slots + k] = p.shared == 2 ? shared_gate_weight(lg[E]) : 1.0f;
  }
}

}  // namespace frink::cuda

template <int kPer>
__global__ void old_route(RouteParams p) {
  frink::cuda::old_route_token<kPer>(p, blockIdx.x, nullptr, true);
}


// Microseconds a step of a graph of kSteps launches of launch().
template <class F>
float graph_step_us(cudaStream_t st, F launch) {
  return graph_median_us(st, [&] { for (int s = 0; s < kSteps; ++s) launch(); }, 5) / kSteps;
}

// Runs both routings of the same token into slots [0, 32) and [32, 64) of the outputs.
template <int kPer>
void launch_both(const RouteParams& p, cudaStream_t st) {
  RouteParams q = p;
  old_route<kPer><<<1, 32, 0, st>>>(q);
  q.expert += 32, q.weight += 32;
  warp_route<kPer><<<1, 32, 0, st>>>(q);
}

template <int kPer>
int run_case(cudaStream_t st, int n_expert, int k) {
  std::mt19937 rng(n_expert);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> lg(n_expert + 1), bias(n_expert);
  float* dl = nullptr;
  float* db = nullptr;
  int32_t* de = nullptr;
  float* dw = nullptr;
  CK(cudaMalloc(&dl, (n_expert + 1) * sizeof(float)));
  CK(cudaMalloc(&db, n_expert * sizeof(float)));
  CK(cudaMalloc(&de, 2 * 32 * sizeof(int32_t)));
  CK(cudaMalloc(&dw, 2 * 32 * sizeof(float)));
  RouteParams p;
  p.logits = dl;
  p.n_tok = 1;
  p.n_expert = n_expert;
  p.k = k;
  p.norm_w = true;
  p.expert = de;
  p.weight = dw;
  p.stream = st;
  // The bits of the two against each other: each gating, with and without a selection
  // bias, a stacked shared expert, logits rounded to whole numbers (ties) or -inf, 20 draws each.
  int differ = 0;
  for (int trial = 0; trial < 240; ++trial) {
    for (auto& v : lg) v = nd(rng);
    if (trial % 2) for (auto& v : lg) v = std::round(v);
    if (trial % 5 == 0) for (size_t e = trial % 7; e < lg.size(); e += 7) lg[e] = -INFINITY;
    if (trial >= 236) for (auto& v : lg) v = -INFINITY;  // a row of -inf: NaN weights, the same ones
    for (auto& v : bias) v = 0.1f * nd(rng);
    RouteParams q = p;
    q.gating = trial % 3;
    q.sel_bias = trial % 4 == 1 ? db : nullptr;
    q.shared = (trial / 4) % 3;
    q.norm_w = (trial / 12) % 2 == 0;
    q.w_scale = (trial / 24) % 2 ? 2.5f : 1.0f;
    q.k = q.shared ? std::min(k, 31) : k;
    CK(cudaMemcpy(dl, lg.data(), lg.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, bias.data(), bias.size() * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemset(de, 0xff, 2 * 32 * sizeof(int32_t)));
    CK(cudaMemset(dw, 0xff, 2 * 32 * sizeof(float)));
    launch_both<kPer>(q, st);
    CK(cudaStreamSynchronize(st));
    int32_t ex[64];
    float w[64];
    CK(cudaMemcpy(ex, de, sizeof(ex), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(w, dw, sizeof(w), cudaMemcpyDeviceToHost));
    const size_t n = q.k + (q.shared != 0);
    differ += std::memcmp(ex, ex + 32, n * sizeof(int32_t)) != 0 || std::memcmp(w, w + 32, n * sizeof(float)) != 0;
  }
  RouteParams q = p;
  q.expert += 32, q.weight += 32;
  // k and k 1 (the rounds' share, k - 1 of them, by difference).
  for (const int kk : {k, 1}) {
    p.k = q.k = kk;
    const float old_us = graph_step_us(st, [&] { old_route<kPer><<<1, 32, 0, st>>>(p); });
    const float new_us = graph_step_us(st, [&] { warp_route<kPer><<<1, 32, 0, st>>>(q); });
    std::printf("%3d experts, k %2d: main's %.2f, route_token %.2f us a step\n", n_expert, kk, old_us, new_us);
  }
  std::printf("%3d experts: %d of 240 routings differ in a bit\n", n_expert, differ);
  cudaFree(dl);
  cudaFree(db);
  cudaFree(de);
  cudaFree(dw);
  return differ ? 1 : 0;
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int* v = nullptr;
  CK(cudaMalloc(&v, 2 * sizeof(int)));
  CK(cudaMemset(v, 0, 2 * sizeof(int)));
  std::printf("empty one-block kernel: %.2f us a step\n", graph_step_us(st, [&] { empty_kernel<<<1, 32, 0, st>>>(v); }));
  int bad = run_case<4>(st, 128, 8);
  bad |= run_case<8>(st, 256, 8);
  bad |= run_case<16>(st, 512, 10);
  cudaFree(v);
  return bad;
}
