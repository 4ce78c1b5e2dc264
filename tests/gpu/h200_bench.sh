#!/usr/bin/env bash
# Call 2 on the H200 (same machine as h200_build.sh): every mode side by side at 25, 50 and 75% of the experts,
# llama.cpp's own split for the same VRAM and the all-in-VRAM ceiling, then where a hybrid token's time goes.
set -u
. tests/gpu/h200_setup.sh
# the lifecycle loop under compute-sanitizer first (every cache mode, the hybrid through the mailbox), while
# the big model finishes writing
timeout 150 env ITERATIONS=1 bash tests/gpu/lifecycle_cuda.sh 2>&1 | tail -4
while pgrep -f "llama_moe synth" > /dev/null; do sleep 2; done
ls -la /tmp/q30.gguf
python3 -m llama_moe bench /tmp/q30.gguf -t 16 --runs 3 -n 128 --cache-pct 25 50 75 --json $OUT/bench.json --md $OUT/bench.md \
    --png $OUT/bench.png 2>&1 | tee $OUT/bench.log | tail -24
# the hybrid through the scheduler instead of the mailbox (issue 9's before/after), and where a generated
# token's time goes both ways (issue 4): GPU, CPU, and the hand-overs between them
LLAMA_MOE_CACHE_NO_MAILBOX=1 timeout 150 python3 -m llama_moe bench /tmp/q30.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50 75 \
    --modes hybrid --no-vram 2>&1 | tee $OUT/bench_split.log | tail -4
for mb in "" 1; do
  env ${mb:+LLAMA_MOE_CACHE_NO_MAILBOX=1} GGML_SCHED_PROFILE=1 timeout 100 python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 1 -n 64 \
      --cache-pct 50 --modes hybrid --no-vram 2>&1 | grep -E "ggml_sched_profile|mailbox|hybrid" | tee -a $OUT/sched_profile.txt | tail -10
done
