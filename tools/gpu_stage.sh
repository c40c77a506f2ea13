#!/bin/bash
# Stages what tools/gpu_run.sh needs on the GPU machine into .fixtures/gpu (git-ignored):
# the dev machine's CUDA build of frink and test_gpu, the shared libraries they need that the
# device image lacks, and the fixtures the GPU tests read (../shared does not travel there).
# The device tool carries at most 64 MiB with the tracked tree (31 MiB, the shipped model most
# of it), so the stage is packed into .fixtures/carry/gpu.tar.xz (21 MiB); carry
# [".fixtures/carry"] and tools/gpu_run.sh unpacks it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-cuda}
G=$root/.fixtures/gpu
shared=$root/../shared/testdata
mkdir -p "$G/bin" "$G/lib" "$G/testdata/llamacpp/archs" "$G/testdata/models"
cp "$build/frink" "$build/tests/test_gpu" "$G/bin/"
for so in libfmt.so.9 libpcre2-8.so.0; do cp -L "$(ldconfig -p | awk -v n=$so '$1 == n {print $NF; exit}')" "$G/lib/"; done
rm -rf "$G/testdata/llamacpp/quant"
# QUANT=0 leaves the quant fixtures (24 MiB) out, to make room for the hybrids' (ARCHS below).
if [ "${QUANT:-1}" != 0 ]; then
  cp -r "$shared/llamacpp/quant" "$G/testdata/llamacpp/quant" &&
    rm -rf "$G/testdata/llamacpp/quant/dequant"  # the GPU tests do not read it
fi
# Arch fixtures: by default three dense ones (plain llama, QK-norm qwen3, softcaps + window
# gemma2); the carry limit leaves room for about 26 MiB of them, so the GGUF hybrids
# (ARCHS="qwen3next-moe qwen35-dense qwen35moe-moe", read by the HybridDevice tests) take a call
# of their own.
rm -f "$G/testdata/llamacpp/archs/"*.gguf
for f in ${ARCHS:-llama-dense qwen3-dense gemma2-dense}; do cp "$shared/llamacpp/archs/$f.gguf" "$G/testdata/llamacpp/archs/"; done
cp "$shared/models/stories260K.gguf" "$G/testdata/models/"
mkdir -p "$root/.fixtures/carry"
tar -C "$G" -cf - bin lib testdata | xz -6 -T0 > "$root/.fixtures/carry/gpu.tar.xz"
du -sh "$G" "$root/.fixtures/carry/gpu.tar.xz"
