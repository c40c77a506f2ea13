#!/bin/bash
# A/B of two frink builds in one device call (run on the GPU machine from the repository root,
# with carry [".fixtures/carry"]): graph time per decode token (`frink bench -v`), alternating
# the two binaries ROUNDS times on the same synth file, so that both see the same machine.
# Here: build A (say, HEAD), `xz -c build-cuda/frink > .fixtures/carry/frink_a.xz`; build B
# (the change) and `tools/gpu_stage.sh build-cuda`. For environment switches within one
# binary, tools/gpu_run.sh's VARIANTS does the same.
#   PRESETS="llama3.1-8b qwen3-30b-a3b" TYPE=Q4_0 ROUNDS=3 bash tools/gpu_ab.sh
# SYNTH_FLAGS go to frink synth, DEPTHS to the bench (-d), KEEP=1 leaves /tmp/m.gguf (of the
# last preset) for later commands of the call.
set -o pipefail
G=$PWD/.fixtures/gpu
[ -d "$G/bin" ] || { mkdir -p "$G" && xz -dc .fixtures/carry/gpu.tar.xz | tar -C "$G" -xf -; }
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
chmod +x "$G"/bin/*
xz -dc .fixtures/carry/frink_a.xz > /tmp/frink_a && chmod +x /tmp/frink_a
for P in ${PRESETS:-llama3.1-8b}; do
  "$G/bin/frink" synth --preset "$P" --type "${TYPE:-Q4_0}" ${SYNTH_FLAGS} -o /tmp/m.gguf 2>&1 | tail -1
  for r in $(seq "${ROUNDS:-2}"); do
    for b in /tmp/frink_a "$G/bin/frink"; do
      echo "== $P $([ "$b" = /tmp/frink_a ] && echo A || echo B)"
      "$b" bench -m /tmp/m.gguf --device cuda -p 0 -n 128 -d "${DEPTHS:-0}" -r "${REPS:-2}" --peak-gbps 4300 -v 2>&1 |
        grep -E "tg128|graph" | sed 's/on the host.*//'
    done
  done
  [ -n "$KEEP" ] || rm -f /tmp/m.gguf
done
