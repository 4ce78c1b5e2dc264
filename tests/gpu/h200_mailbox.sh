#!/usr/bin/env bash
# Call 3 on the H200 (same machine): the lifecycle loop under compute-sanitizer (every cache mode, the hybrid
# through the mailbox), the hybrid through the scheduler instead of the mailbox (issue 9's before/after), and
# where a generated token's time goes both ways (issues 4 and 9): GPU, CPU, and the hand-overs between them.
set -u
. tests/gpu/h200_setup.sh
timeout 150 env ITERATIONS=1 bash tests/gpu/lifecycle_cuda.sh 2>&1 | tail -4
LLAMA_MOE_CACHE_NO_MAILBOX=1 timeout 200 python3 -m llama_moe bench /tmp/q30.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50 75 \
    --modes hybrid --no-vram 2>&1 | tee $OUT/bench_split.log | tail -4
for mb in "" 1; do
  env ${mb:+LLAMA_MOE_CACHE_NO_MAILBOX=1} GGML_SCHED_PROFILE=1 timeout 100 python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 \
      --runs 1 -n 64 --cache-pct 50 --modes hybrid --no-vram 2>&1 | grep -E "ggml_sched_profile|mailbox|hybrid" \
      | tee -a $OUT/sched_profile.txt | tail -10
done
