#!/usr/bin/env bash
# One call on a fresh H200 (about 9.5 min), the 2026-11-30 run (issue 9): the fused mailbox kernels plus the device's
# own step counts, checked against the scheduler bit for bit on the tiny model, then the hybrid at 50% against
# the scheduler's and all in VRAM over 15 runs each, the old kernels (LLAMA_MOE_MAILBOX_FUSE=0) over 15, the
# hand-over alone (LLAMA_MOE_MAILBOX_TEST_EMPTY=1), and 25% and 75% beside upload mode.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
equivalence tiny q8_0 /tmp
q30_profile
q30_bench fused 15 50 hybrid,hybrid-no-mailbox,vram
q30_bench unfused 15 50 hybrid LLAMA_MOE_MAILBOX_FUSE=0
q30_bench empty 5 50 hybrid LLAMA_MOE_MAILBOX_TEST_EMPTY=1
q30_bench sizes 3 "25 75" upload,hybrid,hybrid-no-mailbox
tar czf $OUT/runs.tgz /tmp/*.log /tmp/*.json /tmp/*.md 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
