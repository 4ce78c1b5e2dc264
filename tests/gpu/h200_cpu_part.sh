#!/usr/bin/env bash
# The mailbox's CPU part on a fresh H200 (about 9 min; issue 9): the build and the model as in h200_build.sh,
# then the hybrid at 50% in fresh processes with the expert rows prefetched 0, 4 and 16 KiB ahead
# (LLAMA_MOE_MAILBOX_PREFETCH) and rows taken in chunks of 32, 128 or a slice per thread (GGML_MMID_CHUNK),
# each with its exit lines (a part's time, its products' bandwidth); then the best against the scheduler and
# the all-in-VRAM bound, 5 runs.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
q30_profile
for v in "4096 32" "0 32" "16384 32" "4096 128" "4096 0" "16384 0"; do
  set -- $v
  LLAMA_MOE_MAILBOX_PREFETCH=$1 GGML_MMID_CHUNK=$2 timeout $(left 430) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 1 -n 64 \
      --cache-pct 50 --modes hybrid --no-vram --profile /tmp/q30.strp > $OUT/part_$1_$2.log 2>&1
  echo "prefetch $1 chunk $2: $(grep -E "mailbox: a part" $OUT/part_$1_$2.log | sed -E 's/.*took //')"
  grep -E "hybrid .*cache" $OUT/part_$1_$2.log | sed -E 's/^ +//'
done
timeout $(left 590) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 5 -n 128 --cache-pct 50 --modes hybrid,hybrid-no-mailbox,vram \
    --profile /tmp/q30.strp --json $OUT/bench50.json --md $OUT/bench50.md > $OUT/bench50.log 2>&1
grep -E "mailbox: the CPU|mailbox: a part" $OUT/bench50.log; cat $OUT/bench50.md
echo "total: $(( $(date +%s) - T0 )) s"
