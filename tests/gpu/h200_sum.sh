#!/usr/bin/env bash
# One call on a fresh H200 (about 9 min), the 2026-11-30 run (issue 9): the send that also routes (one kernel fewer
# a layer) and the recv that weights and sums the layer's rows (two fewer), after ncu put the hand-over's cost in
# the mailbox's own three kernels (h200_kernels.sh). Equivalence on the tiny model with Q4_0 experts (the
# mailbox against the scheduler bit for bit, and the GPU's host reads against no cache), then the hybrid at 50%
# against the scheduler's and all in VRAM, 12 runs each.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
f=/tmp/equivalence_tiny_q4_0.md
timeout 70 python3 tests/gpu/cuda_equivalence.py --shape tiny --experts q4_0 -n 64 --no-prompt \
    --modes hybrid,gpu-reads-all 2>&1 | grep -E "^'|EQUIVALENT|DIFFERENT|Error" > $f
echo "tiny q4_0: $(grep -c -- '-> ok' $f) ok, $(grep -c WRONG $f) wrong; $(tail -1 $f)"; grep WRONG $f | head -5
q30_profile
q30_bench sum 12 50 hybrid,hybrid-no-mailbox,vram
tar czf $OUT/runs.tgz /tmp/*.log /tmp/*.json /tmp/*.md 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
