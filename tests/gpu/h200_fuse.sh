#!/usr/bin/env bash
# One call on a fresh H200 (about 9 min), the 2026-11-30 run (issue 9): the mailbox's fused kernels (the send writes
# the device's input rows, the recv adds the CPU's rows) checked against the scheduler bit for bit, the hybrid
# at 50% against the scheduler's and all in VRAM, then the same hybrid with the old kernels
# (LLAMA_MOE_MAILBOX_FUSE=0), with the hand-over alone (LLAMA_MOE_MAILBOX_TEST_EMPTY=1: wrong output, timing
# only) and without CUDA graphs; the zero-copy read probe for docs/design-miss-sharing.md.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
nvcc -O2 -std=c++17 -arch=sm_90 tests/gpu/zero_copy_probe.cu -o /tmp/zcp -lpthread && timeout 60 /tmp/zcp 15 > $OUT/zero_copy.txt 2>&1
cat $OUT/zero_copy.txt
equivalence tiny q8_0 $OUT
echo "equivalence done: $(( $(date +%s) - T0 )) s"
q30_profile
q30_bench fused 5 50 hybrid,hybrid-no-mailbox,vram
q30_bench unfused 5 50 hybrid LLAMA_MOE_MAILBOX_FUSE=0
q30_bench empty 5 50 hybrid LLAMA_MOE_MAILBOX_TEST_EMPTY=1
q30_bench nographs 5 50 hybrid,vram GGML_CUDA_DISABLE_GRAPHS=1
equivalence gpt-oss-tiny mxfp4 $OUT
tar czf $OUT/logs.tgz /tmp/*.log /tmp/*.json /tmp/*.md 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
