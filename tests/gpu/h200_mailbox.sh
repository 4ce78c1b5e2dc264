#!/usr/bin/env bash
# Call 3 on the H200 (same machine, after h200_bench.sh): where a generated token's time goes with the
# mailbox and without it (issues 4 and 9): GPU, CPU and the hand-overs between them; then the lifecycle loop
# under compute-sanitizer (every cache mode, the hybrid through the mailbox; issue 10).
set -u
. tests/gpu/h200_setup.sh
for mb in "" 1; do
  env ${mb:+LLAMA_MOE_CACHE_NO_MAILBOX=1} GGML_SCHED_PROFILE=1 GGML_CPU_OP_PROFILE=1 timeout 100 python3 -m llama_moe -v \
      bench /tmp/q30.gguf -t 16 --runs 1 -n 64 --cache-pct 50 --modes hybrid --no-vram --profile /tmp/q30.strp 2>&1 \
      | tee $OUT/sched_profile${mb:+_no_mailbox}.txt | grep -E "ggml_sched_profile|cpu_op_profile|mailbox|hybrid" | tail -14
done
timeout 200 env ITERATIONS=1 bash tests/gpu/lifecycle_cuda.sh 2>&1 | tail -4
