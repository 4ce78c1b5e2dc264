#!/usr/bin/env bash
# One call on a fresh H200 (about 7 min): the 2026-11-30 last build (gpt-oss's activation vectorized, the
# mailbox's threads a slice of rows each), its CUDA equivalence on the tiny model and a tiny gpt-oss (the
# mailbox against the scheduler bit for bit), then the hybrid at 50% with and without the mailbox against all
# in VRAM, 5 runs, with the mailbox's exit lines (issue 9).
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
equivalence tiny q8_0 $OUT
equivalence gpt-oss-tiny mxfp4 $OUT
echo "equivalence done: $(( $(date +%s) - T0 )) s"
q30_profile
timeout $(left 560) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 5 -n 128 --cache-pct 50 \
    --modes hybrid,hybrid-no-mailbox,vram --profile /tmp/q30.strp --json $OUT/bench50.json --md $OUT/bench50.md > $OUT/bench50.log 2>&1
grep -E "RAM read|host to device|mailbox: the CPU|mailbox: a part" $OUT/bench50.log | sed -E 's/^ +//'; cat $OUT/bench50.md
echo "total: $(( $(date +%s) - T0 )) s"
