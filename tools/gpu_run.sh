#!/bin/bash
# The issue-6 device call in one script (run on the GPU machine from the repository root):
# GPU tests, then frink bench on llama3.1-8b synth files, then optionally an ncu per-kernel
# profile of decode. Device time is scarce, so everything happens in one call.
#
# Binaries: built on the dev machine (nvcc compiles there but cannot run) and carried, which
# saves the device a build:
#   cmake -S . -B build-cuda -DFRINK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
#   cmake --build build-cuda -j2 --target frink test_gpu
#   tools/gpu_stage.sh          # copies binaries, their .so files and the fixtures
# then run with carry [".fixtures/carry"] (the packed stage):
#   TYPES="Q4_0 Q8_0" DEPTHS=0,4096,16384 PROFILE=1 bash tools/gpu_run.sh
# PROFILE=1 adds an ncu decode profile per type, PROFILE_PP=1 one of a pp512 batch; both are
# slow (ncu replays each kernel): keep TYPES short when profiling. NCU_FLAGS="--cache-control none"
# keeps L2 warm between kernels as in a real run (by default ncu flushes it before each).
# SYNTH_FLAGS go to frink synth (e.g. "--layers 8" for the 80B hybrid).
# NO_BENCH=1 skips the benches (a profile-only call), NO_TESTS=1 the GPU tests (later runs of
# one call); VARIANTS (below) benches each file under several environment settings. MICRO=1
# first builds and runs the microbenchmarks (tools/stream_ceiling.cu, step_latency.cu, layer_stream.cu)
# with the device's nvcc.
# Without carried binaries it builds here (-j16, sm_90) first.
set -o pipefail
G=$PWD/.fixtures/gpu
[ -f .fixtures/carry/gpu.tar.xz ] && mkdir -p "$G" && xz -dc .fixtures/carry/gpu.tar.xz | tar -C "$G" -xf -
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FRINK_GPU_TESTDATA=$G/testdata FRINK_HF_FIXTURES=$PWD/tests/fixtures/hf
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ -x "$G/bin/frink" ] || [ -f "$G/bin/frink" ]; then
  chmod +x "$G"/bin/*
  FRINK=$G/bin/frink TEST_GPU=$G/bin/test_gpu
else
  cmake -S . -B build-gpu -DFRINK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build-gpu -j16 --target frink test_gpu 2>&1 | grep -E "error|warning" | head -20
  FRINK=$PWD/build-gpu/frink TEST_GPU=$PWD/build-gpu/tests/test_gpu
fi
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv,noheader
if [ -n "$MICRO" ]; then
  for m in stream_ceiling step_latency layer_stream; do
    nvcc -O3 -arch=sm_90 "tools/$m.cu" -o "/tmp/$m" && timeout 120 "/tmp/$m" 2>&1 | tee "$OUT/$m.txt"
  done
fi
if [ -z "$NO_TESTS" ]; then  # NO_TESTS=1: benches only (test_gpu.txt is left as it was)
  timeout ${TEST_TIMEOUT:-200} "$TEST_GPU" > "$OUT/test_gpu.txt" 2>&1
  grep -E "^\[gpu\]" "$OUT/test_gpu.txt" | head -80
  grep -E "FAILED|PASSED|Failure|error" "$OUT/test_gpu.txt" | head -20  # never cut by the lines above
fi
for T in ${TYPES:-Q4_0}; do
  "$FRINK" synth --preset ${PRESET:-llama3.1-8b} --type "$T" ${SYNTH_FLAGS} -o /tmp/m.gguf 2>&1 | tail -1
  # VARIANTS: ';'-separated environment settings, one bench each on the same file (an A/B in
  # one call), e.g. VARIANTS="; FRINK_CUDA_KSPLIT=1; FRINK_CUDA_Q4_PAIRS=1"; unset: one plain bench.
  IFS=';' read -r -a variants <<< "${VARIANTS:- }"
  for V in "${variants[@]}"; do
    [ -n "$NO_BENCH" ] && break
    echo "== $T ${V:-(default)}" | tee -a "$OUT/bench.txt"
    # -v adds each tg row's step times (graph on the device against the host's share); the
    # per-batch debug lines it also prints are left out.
    env $V "$FRINK" bench -m /tmp/m.gguf --device cuda -p ${PP:-512} -n 128 -d ${DEPTHS:-0} -r ${REPS:-3} --peak-gbps 4300 -v 2>&1 |
      grep -v "uploading weights\|device batch\|token graph capture\|evicted KV" | tee -a "$OUT/bench.txt"
  done
  if [ -n "$PROFILE" ]; then
    timeout 200 ncu --clock-control none ${NCU_FLAGS} --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_tg_$T.csv" \
      "$FRINK" bench -m /tmp/m.gguf --device cuda -p 0 -n 2 -r 1 >/dev/null 2>&1
    python3 tools/ncu_summary.py "$OUT/ncu_tg_$T.csv" --grid | head -40
  fi
  if [ -n "$PROFILE_PP" ]; then  # one pp512 batch per kernel (the warm-up batch is profiled too)
    timeout 200 ncu --clock-control none ${NCU_FLAGS} --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_pp_$T.csv" \
      "$FRINK" bench -m /tmp/m.gguf --device cuda -p 512 -n 0 -r 1 >/dev/null 2>&1
    python3 tools/ncu_summary.py "$OUT/ncu_pp_$T.csv" | head -30
  fi
  rm -f /tmp/m.gguf
done
