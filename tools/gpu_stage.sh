#!/bin/bash
# Stages what tools/gpu_run.sh needs on the GPU machine into .fixtures/gpu (git-ignored):
# the dev machine's CUDA build of frink and test_gpu, the shared libraries they need that the
# device image lacks, and the fixtures the GPU tests read (../shared does not travel there).
# Keep the total under the device tool's 64 MiB carry limit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-cuda}
G=$root/.fixtures/gpu
shared=$root/../shared/testdata
mkdir -p "$G/bin" "$G/lib" "$G/testdata/llamacpp/archs" "$G/testdata/models"
cp "$build/frink" "$build/tests/test_gpu" "$G/bin/"
for so in libfmt.so.9 libpcre2-8.so.0; do cp -L "$(ldconfig -p | awk -v n=$so '$1 == n {print $NF; exit}')" "$G/lib/"; done
rm -rf "$G/testdata/llamacpp/quant" && cp -r "$shared/llamacpp/quant" "$G/testdata/llamacpp/quant"
# Three of the seven dense archs (64 MiB): plain llama, QK-norm (qwen3), softcaps + window (gemma2).
for f in llama-dense qwen3-dense gemma2-dense; do cp "$shared/llamacpp/archs/$f.gguf" "$G/testdata/llamacpp/archs/"; done
cp "$shared/models/stories260K.gguf" "$G/testdata/models/"
du -sh "$G"
