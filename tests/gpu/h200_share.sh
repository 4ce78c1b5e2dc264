#!/usr/bin/env bash
# One call on a fresh H200 (about 9.5 min), the 2026-11-30 run (issue 9): the route that splits a layer's misses
# between the CPU and the GPU's own reads of the page-locked experts, and the steps with nothing for the CPU
# that the GPU no longer waits for. Equivalence on tiny models (Q8_0 and Q4_0 experts: the GPU's host reads
# against no cache, the CPU-only mailbox against the scheduler bit for bit), then the hybrid at 50% at the
# default share, at 0 (the CPU computes every miss) and at 1 (the GPU reads every miss), against the scheduler
# and all in VRAM.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
eq() { # shape experts: the modes that hand over, 2 prompts' worth of time
  local f=/tmp/equivalence_$1_$2.md
  timeout 75 python3 tests/gpu/cuda_equivalence.py --shape $1 --experts $2 -n 64 --no-prompt \
      --modes hybrid,gpu-reads-all,cpu-reads-all 2>&1 | grep -E "^'|EQUIVALENT|DIFFERENT|Error" > $f
  echo "$1 $2: $(grep -c -- '-> ok' $f) ok, $(grep -c WRONG $f) wrong; $(tail -1 $f)"
  grep WRONG $f | head -5
}
eq tiny q4_0
eq tiny q8_0
q30_profile
q30_bench share_default 8 50 hybrid,hybrid-no-mailbox,vram
q30_bench share_1 8 50 hybrid LLAMA_MOE_MAILBOX_GPU_SHARE=1
q30_bench share_0 8 50 hybrid LLAMA_MOE_MAILBOX_GPU_SHARE=0
q30_bench share_06 8 50 hybrid LLAMA_MOE_MAILBOX_GPU_SHARE=0.6
tar czf $OUT/runs.tgz /tmp/*.log /tmp/*.json /tmp/*.md 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
