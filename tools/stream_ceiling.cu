// Read-bandwidth ceilings for decode products (issue 6): how fast can a kernel of a given
// shape stream a weight matrix that does not fit L2, with the arithmetic taken out? Built and
// run on the GPU machine by hand: nvcc -O3 -arch=sm_90 tools/stream_ceiling.cu -o /tmp/sc && /tmp/sc
// Shapes: (a) grid-stride 16-byte loads, 4 in flight per lane (the ceiling); (b) frink's stream
// kernel skeleton: one warp per row pair, chunks of 1152 bytes copied by cp.async, two stages,
// four warps per block, a token read of the copy; (c) (b) with each warp's rows read straight
// into registers (all of a row pair's 16-byte loads issued before any use).
#include <string>

#include "microbench.cuh"

// Each lane loads its 16-byte pieces of both rows into registers, all issued at once.
template <int RowBytes, int Warps>
__global__ void __launch_bounds__(Warps * 32) direct(const uint8_t* w, int64_t n_rows, unsigned* out) {
  constexpr int kPer = (RowBytes / 16 + 31) / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pair = int64_t{blockIdx.x} * Warps + warp;
  if (2 * pair >= n_rows) return;
  uint4 v[2][kPer];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int off = (k * 32 + lane) * 16;
      v[r][k] = off < RowBytes ? __ldg(reinterpret_cast<const uint4*>(w + (2 * pair + r) * int64_t{RowBytes} + off)) : make_uint4(0, 0, 0, 0);
    }
  unsigned acc = 0;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < kPer; ++k) acc ^= v[r][k].x ^ v[r][k].w;
  if (acc == 0x12345678) out[0] = acc;
}

// Milliseconds of one launch, the median of 20 (launched one at a time, events around each).
template <class F>
float time_ms(F f) {
  return median_us(0, f, 20) * 1e-3f;
}

// The same grid-stride read over matrices of 33 MB to 2 GB (argument "sizes"), each launch
// timed alone (events around it): the smaller the read, the more its launch latency, ramp and
// tail weigh. Timed alone these overstate what the products lose in a token: back to back in
// one graph, a layer's four bare reads reach 3.6 TB/s (tools/layer_stream.cu).
int sizes() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int64_t total = int64_t{6} << 30;  // rotated copies: never read from L2
  uint8_t* buf;
  unsigned* out;
  CK(cudaMalloc(&buf, total));
  CK(cudaMalloc(&out, 4));
  CK(cudaMemset(buf, 1, total));
  for (const int64_t mb : {33, 66, 132, 235, 470, 1050, 2100}) {
    const int64_t bytes = mb << 20;
    const int copies = static_cast<int>(std::min<int64_t>(8, total / bytes));
    int rot = 0;
    for (int bpsm : {8, 16}) {
      const float ms = time_ms([&] {
        rot = (rot + 1) % copies;
        grid_stride<<<sms * bpsm, 256>>>(reinterpret_cast<const uint4*>(buf + rot * bytes), bytes / 16, out);
      });
      printf("grid-stride %5lld MB, %2d blocks/SM x 256: %9.2f us  %6.2f TB/s\n", static_cast<long long>(mb), bpsm,
             ms * 1e3, bytes / (ms * 1e-3) / 1e12);
    }
  }
  CK(cudaGetLastError());
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "sizes") return sizes();
  // Several copies of the matrix, rotated, so each launch reads one L2 does not hold.
  const int64_t rows = 28672, row_bytes = 2304, bytes = rows * row_bytes;  // 8B Q4_0 gate+up
  const int copies = 8;
  uint8_t* buf;
  unsigned* out;
  CK(cudaMalloc(&buf, bytes * copies));
  CK(cudaMalloc(&out, 4));
  CK(cudaMemset(buf, 1, bytes * copies));
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int rot = 0;
  auto next = [&] { rot = (rot + 1) % copies; return buf + rot * bytes; };
  auto report = [&](const char* name, float ms) { printf("%-44s %8.2f us  %6.2f TB/s\n", name, ms * 1e3, bytes / (ms * 1e-3) / 1e12); };
  for (int bpsm : {4, 8, 16, 32}) {
    char n[64];
    snprintf(n, sizeof n, "grid-stride 16B x4, %d blocks/SM x 256", bpsm);
    report(n, time_ms([&] { grid_stride<<<sms * bpsm, 256>>>(reinterpret_cast<const uint4*>(next()), bytes / 16, out); }));
  }
  report("staged 1152 B chunks, 4 warps (frink v5)", time_ms([&] { staged<1152, 4><<<(rows / 2 + 3) / 4, 128>>>(next(), row_bytes, rows, out); }));
  report("staged 1152 B chunks, 8 warps", time_ms([&] { staged<1152, 8><<<(rows / 2 + 7) / 8, 256>>>(next(), row_bytes, rows, out); }));
  report("staged 576 B chunks, 4 warps", time_ms([&] { staged<576, 4><<<(rows / 2 + 3) / 4, 128>>>(next(), row_bytes, rows, out); }));
  report("staged 2304 B chunk (whole row), 4 warps", time_ms([&] { staged<2304, 4><<<(rows / 2 + 3) / 4, 128>>>(next(), row_bytes, rows, out); }));
  report("direct, row pair in registers, 4 warps", time_ms([&] { direct<2304, 4><<<(rows / 2 + 3) / 4, 128>>>(next(), rows, out); }));
  report("direct, row pair in registers, 8 warps", time_ms([&] { direct<2304, 8><<<(rows / 2 + 7) / 8, 256>>>(next(), rows, out); }));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return 0;
}
