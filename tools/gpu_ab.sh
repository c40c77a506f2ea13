#!/bin/bash
# A/B of frink builds in one device call (run on the GPU machine from the repository root,
# with carry [".fixtures/carry"]): graph time per decode token (`frink bench -v`), alternating
# the binaries ROUNDS times on the same synth file, so that all see the same machine.
# Here: build A (say, HEAD), `xz -c build-cuda/frink > .fixtures/carry/frink_a.xz`; build B
# (the change) and `tools/gpu_stage.sh build-cuda`. More builds to compare go beside A as
# .fixtures/carry/frink_LABEL.xz (about 3 MB each: the carry holds 64 MiB with the tree). For
# environment switches within one binary, tools/gpu_run.sh's VARIANTS does the same.
#   PRESETS="llama3.1-8b qwen3-30b-a3b" TYPE=Q4_0 ROUNDS=3 bash tools/gpu_ab.sh
# SYNTH_FLAGS go to frink synth, DEPTHS to the bench (-d), KEEP=1 leaves /tmp/m.gguf (of the
# last preset) for later commands of the call.
set -o pipefail
G=$PWD/.fixtures/gpu
[ -d "$G/bin" ] || { mkdir -p "$G" && xz -dc .fixtures/carry/gpu.tar.xz | tar -C "$G" -xf -; }
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
chmod +x "$G"/bin/*
bins=()
for f in .fixtures/carry/frink_*.xz; do  # frink_a.xz first (glob order), then the other labels
  label=$(basename "$f" .xz)
  xz -dc "$f" > "/tmp/$label" && chmod +x "/tmp/$label" && bins+=("/tmp/$label")
done
bins+=("$G/bin/frink")
for P in ${PRESETS:-llama3.1-8b}; do
  "$G/bin/frink" synth --preset "$P" --type "${TYPE:-Q4_0}" ${SYNTH_FLAGS} -o /tmp/m.gguf 2>&1 | tail -1
  for r in $(seq "${ROUNDS:-2}"); do
    for b in "${bins[@]}"; do
      echo "== $P $([ "$b" = "$G/bin/frink" ] && echo B || basename "$b" | sed 's/^frink_//; s/^a$/A/')"
      "$b" bench -m /tmp/m.gguf --device cuda -p 0 -n 128 -d "${DEPTHS:-0}" -r "${REPS:-2}" --peak-gbps 4300 -v 2>&1 |
        grep -E "tg128|graph"  # the graph line keeps the host's share of a step
    done
  done
  [ -n "$KEEP" ] || rm -f /tmp/m.gguf
done
