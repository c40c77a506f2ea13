// A decode token's routed experts in one launch: per slot, a cluster of C blocks; block r of a
// slot's cluster copies rows [r F/C, (r + 1) F/C) of its expert's gate and up and rows
// [r E/C, (r + 1) E/C) of its down into shared memory at once, computes its share of the GLU,
// hands it to every block of the cluster (distributed shared memory), and after the cluster's
// barrier quantizes the whole GLU as the down product's input and computes its down rows.
// Why: as three launches (gate|up, GLU with its quantization, down), the down's weights could
// only start streaming once the gate|up's blocks left the SMs, and each launch paid its own
// ramp and tail (qwen3-30b-a3b, ncu: 9.2 + 2.7 + 9.2 us a layer for ~21 MB, 1.15 TB/s).
// Here all of a layer's expert bytes are in flight from the routing's end.
#include "cuda/moe_experts.cuh"

#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "cuda/block_dot.cuh"
#include "cuda/cuda_check.h"
#include "cuda/glu_value.cuh"
#include "cuda/pdl.cuh"
#include "cuda/q8_0_rule.cuh"
#include "cuda/q8k_rule.cuh"

namespace frink::cuda {

namespace {

using mm::Args;
using mm::StagedAct;

constexpr int kThreads = 512, kWarps = kThreads / 32;

struct FusedParams {
  const uint8_t* gate;  // expert 0's gate rows; up likewise (a fused gate_up: F rows on)
  const uint8_t* up;
  size_t gu_row, gu_expert;
  const uint8_t* down;
  size_t dn_row, dn_expert;
  const int32_t* slot_expert;
  StagedAct x;  // h's blocks, as the gate/up products read them
  int64_t E, F;
  int C;  // cluster size (grid x)
  bool gelu;
  float* y;
  int64_t y_stride;
  uint32_t off_dn, off_glu, off_act;  // shared memory: gate rows, up rows, then these
};

template <int T>
constexpr bool kReadsQ8K = T == kQ4_K || T == kQ5_K || T == kQ6_K;

__device__ __forceinline__ void copy16(uint8_t* dst, const uint8_t* src) { __pipeline_memcpy_async(dst, src, 16); }

__device__ __forceinline__ float warp_total(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int TG, int TD>
__global__ void __launch_bounds__(kThreads, 1) fused_experts_kernel(FusedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) uint8_t sm[];
  __shared__ Q8KShared q8k_sh;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t slot = blockIdx.y, Fb = p.F / p.C, Eb = p.E / p.C;
  grid_dependency_wait();  // the routing wrote slot_expert
  const int64_t e = p.slot_expert[slot];
  const size_t gu_bytes = static_cast<size_t>(Fb) * p.gu_row, dn_bytes = static_cast<size_t>(Eb) * p.dn_row;
  {
    const uint8_t* g = p.gate + e * p.gu_expert + rank * gu_bytes;
    const uint8_t* u = p.up + e * p.gu_expert + rank * gu_bytes;
    const uint8_t* d = p.down + e * p.dn_expert + rank * dn_bytes;
    for (size_t o = 16 * static_cast<size_t>(tid); o < gu_bytes; o += 16 * kThreads) {
      copy16(sm + o, g + o);
      copy16(sm + gu_bytes + o, u + o);
    }
    __pipeline_commit();
    for (size_t o = 16 * static_cast<size_t>(tid); o < dn_bytes; o += 16 * kThreads) copy16(sm + p.off_dn + o, d + o);
    __pipeline_commit();
  }
  __pipeline_wait_prior(1);  // gate and up (the down's rows still in flight)
  __syncthreads();

  // GLU value r of this block's share: gate row r and up row r as blocks_dot's row pair.
  float* glu = reinterpret_cast<float*>(sm + p.off_glu);
  Args ag{};
  ag.n_in = p.E;
  for (int64_t r = warp; r < Fb; r += kWarps) {
    float acc[2][1] = {{0.0f}, {0.0f}};
    mm::blocks_dot<TG, 1, 2>(ag, p.x, sm + r * p.gu_row, static_cast<int64_t>(gu_bytes), 0,
                             static_cast<int>(p.E / BlockGeom<TG>::kElems), acc);
    const float gv = warp_total(acc[0][0]), uv = warp_total(acc[1][0]);
    const float v = glu_act(gv, p.gelu) * uv;  // glu_value's expression
    if (lane < p.C) cluster.map_shared_rank(glu, lane)[rank * Fb + r] = v;
  }
  cluster.sync();  // every block holds the whole GLU; no remote write follows

  // The GLU quantized as the down product reads it (act_prep.cu's quantize kernels' rules).
  int8_t* aq = reinterpret_cast<int8_t*>(sm + p.off_act);
  float* ad = reinterpret_cast<float*>(aq + p.F);
  StagedAct xd{};
  if constexpr (kReadsQ8K<TD>) {
    int32_t* as = reinterpret_cast<int32_t*>(ad + p.F / 256);
    for (int64_t sb = 0; sb < p.F / 256; ++sb) {
      const float v = tid < 256 ? glu[sb * 256 + tid] : 0.0f;
      const Q8KElem q = q8k_block_256(v, q8k_sh);
      if (tid < 256) {
        aq[sb * 256 + tid] = static_cast<int8_t>(q.q);
        if (lane == 0) as[sb * 8 + warp] = q.sum;
        if (tid == 0) ad[sb] = q.d;
      }
      __syncthreads();  // q8k_sh's next phase
    }
    xd.q8k = {aq, ad, as};
  } else {
    for (int64_t b = warp; b < p.F / 32; b += kWarps) {
      const Q8Elem q = q8_0_warp_block(glu[b * 32 + lane]);
      aq[b * 32 + lane] = q.q;
      if (lane == 0) ad[b] = q.d;
    }
    xd.q8 = aq;
    xd.d8 = ad;
  }
  __pipeline_wait_prior(0);  // the down's rows
  __syncthreads();

  Args adn{};
  adn.n_in = p.F;
  const uint8_t* dn = sm + p.off_dn;
  float* y = p.y + slot * p.y_stride + rank * Eb;
  for (int64_t r = 2 * warp; r < Eb; r += 2 * kWarps) {
    float acc[2][1] = {{0.0f}, {0.0f}};
    mm::blocks_dot<TD, 1, 2>(adn, xd, dn + r * p.dn_row, static_cast<int64_t>(p.dn_row), 0,
                             static_cast<int>(p.F / BlockGeom<TD>::kElems), acc);
    const float y0 = warp_total(acc[0][0]), y1 = warp_total(acc[1][0]);
    if (lane == 0) {
      y[r] = y0;
      y[r + 1] = y1;
    }
  }
#endif
}

using Kernel = void (*)(FusedParams);

Kernel kernel_for(int tg, int td) {
  if (tg == kQ4_0 && td == kQ4_0) return fused_experts_kernel<kQ4_0, kQ4_0>;
  if (tg == kQ4_K && td == kQ4_K) return fused_experts_kernel<kQ4_K, kQ4_K>;
  if (tg == kQ4_K && td == kQ6_K) return fused_experts_kernel<kQ4_K, kQ6_K>;
  return nullptr;
}

bool aligned16(const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; }

// Clusters of c blocks of `smem` bytes resident at once (the occupancy API, asked once per
// shape: a decode token asks every MoE layer); 0 where the device's shared memory cannot hold
// a block.
int resident_clusters(Kernel k, int c, size_t smem, int64_t n_slots) {
  static std::mutex mu;
  static std::map<std::tuple<Kernel, int, size_t>, int> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(k, c, smem);
  auto it = known.find(key);
  if (it == known.end()) {
    int n = 0;
    const void* f = reinterpret_cast<const void*>(k);
    // The kernel's dynamic limit is set to the most the device allows (not to smem): the
    // attribute is the kernel's, and shapes of several layers share it.
    int dev = 0, optin = 0;
    cudaFuncAttributes fa{};
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
        cudaFuncGetAttributes(&fa, f) == cudaSuccess && smem + fa.sharedSizeBytes <= static_cast<size_t>(optin) &&
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             optin - static_cast<int>(fa.sharedSizeBytes)) == cudaSuccess &&
        cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(static_cast<unsigned>(c), static_cast<unsigned>(n_slots));
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = smem;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = static_cast<unsigned>(c);
      attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&n, f, &cfg) != cudaSuccess) n = 0;
    }
    cudaGetLastError();  // a refused size is an answer here, not an error for the next launch
    it = known.emplace(key, n).first;
  }
  return it->second;
}

}  // namespace

bool launch_fused_experts(const MatmulParams* gu, int n_gu, const MatmulParams& down, const GluParams& g) {
  const MatmulParams& a = gu[0];
  const int64_t E = a.n_in, F = down.n_in, k = a.n_slots;
  if (a.n_tok != 1 || !a.slot_expert || !a.x_prepared || !a.act_round || a.x_div != k || g.oai || !g.up) return false;
  if (n_gu == 1 ? a.n_out != 2 * F : (n_gu != 2 || a.n_out != F)) return false;
  const MatmulParams& b = n_gu == 2 ? gu[1] : gu[0];
  for (const MatmulParams* p : {&a, &b, &down})
    if (p->bias || p->scale != 1.0f || p->expert_scale || p->residual || p->slot_expert != a.slot_expert ||
        p->n_slots != k)
      return false;
  if (b.type != a.type || b.row_bytes != a.row_bytes || b.expert_bytes != a.expert_bytes || b.n_in != E ||
      down.n_out != E || down.x_div != 1 || down.n_tok != k || down.y_stride < E)
    return false;
  const Kernel kern = kernel_for(a.type, down.type);
  if (!kern || !matmul_reads_q8_blocks(a) || matmul_reads_q8_0(a) != (a.type == kQ4_0)) return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9)
    return false;
  const uint8_t* gate = static_cast<const uint8_t*>(a.w);
  const uint8_t* up = n_gu == 2 ? static_cast<const uint8_t*>(b.w) : gate + static_cast<size_t>(F) * a.row_bytes;
  const auto round16 = [](size_t n) { return (n + 15) / 16 * 16; };
  // The cluster size: the smaller of 8 and 16 whose blocks fit and whose clusters are all
  // resident at once; else the one with the most resident (a second, partial wave of slots).
  int c = 0, best = 0;
  size_t smem = 0;
  FusedParams fp{};
  for (const int cc : {8, 16}) {
    const int64_t Fb = F / cc, Eb = E / cc;
    if (F % cc != 0 || E % (2 * cc) != 0 || F % 256 != 0) continue;
    const size_t gu_bytes = static_cast<size_t>(Fb) * a.row_bytes, dn_bytes = static_cast<size_t>(Eb) * down.row_bytes;
    if (gu_bytes % 16 != 0 || dn_bytes % 16 != 0 || a.expert_bytes % 16 != 0 || down.expert_bytes % 16 != 0 ||
        !aligned16(gate) || !aligned16(up) || !aligned16(down.w))
      continue;
    FusedParams q{};
    q.off_dn = static_cast<uint32_t>(2 * gu_bytes);
    q.off_glu = static_cast<uint32_t>(q.off_dn + dn_bytes);
    q.off_act = static_cast<uint32_t>(round16(q.off_glu + static_cast<size_t>(F) * sizeof(float)));
    const size_t bytes = round16(q.off_act + static_cast<size_t>(F) + static_cast<size_t>(F / 32) * 8);
    const int n = resident_clusters(kern, cc, bytes, k);
    if (n > best) {
      best = n;
      c = cc;
      smem = bytes;
      fp = q;
    }
    if (n >= k) break;
  }
  // AB-TEMP: FRINK_FUSED_EXPERTS=0 off, 1 only with every slot's cluster resident at once.
  const char* mode = std::getenv("FRINK_FUSED_EXPERTS");
  if (mode && (mode[0] == '0' || (mode[0] == '1' && best < k))) return false;
  if (c == 0) return false;
  fp.gate = gate;
  fp.up = up;
  fp.gu_row = a.row_bytes;
  fp.gu_expert = a.expert_bytes;
  fp.down = static_cast<const uint8_t*>(down.w);
  fp.dn_row = down.row_bytes;
  fp.dn_expert = down.expert_bytes;
  fp.slot_expert = a.slot_expert;
  if (a.type == kQ4_0) {
    const Q8_0Act q = q8_0_act(a);
    fp.x.q8 = q.q;
    fp.x.d8 = q.d;
  } else {
    fp.x.q8k = q8k_act(a);
  }
  fp.E = E;
  fp.F = F;
  fp.C = c;
  fp.gelu = g.gelu;
  fp.y = down.y;
  fp.y_stride = down.y_stride;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(c), static_cast<unsigned>(k));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = a.stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(c);
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  FRINK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, fp));
  return true;
}

}  // namespace frink::cuda
