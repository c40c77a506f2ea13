#!/usr/bin/env bash
# Builds the fuzzers with clang (ASan + UBSan + libFuzzer) and runs each for SECONDS.
# Usage: fuzz/run.sh [SECONDS=60]. Build folder: $FRINK_FUZZ_BUILD (default build-fuzz).
# Seeds: GgufWriter-made files (fuzz_seeds) plus, when ../shared/testdata exists, the first
# 64 KiB of a few of its GGUF files (copied into the build folder, never into the repository).
# Exits non-zero when a fuzzer finds a crash; the input is left in $BUILD/fuzz/artifacts/.
set -euo pipefail
secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FRINK_FUZZ_BUILD:-$root/build-fuzz}
jobs=${FRINK_FUZZ_JOBS:-2}

cmake -S "$root" -B "$build" -DFRINK_FUZZ=ON -DFRINK_CUDA=OFF \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$jobs" --target fuzz_gguf fuzz_safetensors fuzz_seeds

corpus=$build/fuzz/corpus
artifacts=$build/fuzz/artifacts
mkdir -p "$corpus/gguf" "$corpus/safetensors" "$artifacts"
"$build/fuzz/fuzz_seeds" "$corpus/gguf" "$corpus/safetensors"
shared=$root/../shared/testdata
if [ -d "$shared" ]; then
  for f in models/stories260K.gguf vocab/ggml-vocab-llama-spm.gguf llamacpp/quant/llama-dense-Q4_K_M.gguf; do
    [ -f "$shared/$f" ] && head -c 65536 "$shared/$f" > "$corpus/gguf/shared_$(basename "$f")"
  done
fi

for target in gguf safetensors; do
  echo "== fuzz_$target for ${secs}s"
  log=$build/fuzz/fuzz_$target.log
  set +e
  "$build/fuzz/fuzz_$target" "$corpus/$target" -max_total_time="$secs" -max_len=65536 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$artifacts/${target}_" \
    -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  grep -E "^(Done|stat::number_of_executed_units|stat::average_exec_per_sec)" "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzz_$target found a problem (exit $rc); see $log and $artifacts" >&2
    exit "$rc"
  fi
done
