#!/usr/bin/env bash
# Call 4 on the H200 (same machine): the adaptive cache side by side with right and wrong profiles (issue 5),
# then serve sized to the free VRAM, answering through the official OpenAI and Anthropic clients (issue 8);
# LIFECYCLE=1 first runs the lifecycle loop under compute-sanitizer (the mailbox's kernels included);
# NO_ADAPTIVE=1 leaves the adaptive comparison out, NO_SERVE=1 serve.
set -u
. tests/gpu/h200_setup.sh
[ -n "${LIFECYCLE:-}" ] && timeout 120 env ITERATIONS=1 bash tests/gpu/lifecycle_cuda.sh 2>&1 | tail -4
# the hybrid through the mailbox (NO_MAILBOX=1: through the scheduler)
[ -z "${NO_ADAPTIVE:-}" ] && env ${NO_MAILBOX:+LLAMA_MOE_CACHE_NO_MAILBOX=1} timeout 450 python3 -m llama_moe bench-adaptive /tmp/q30.gguf -t 16 --cache-pct 50 -n 128 --runs 3 \
    --json $OUT/adaptive.json --md $OUT/adaptive.md 2>&1 | tee $OUT/adaptive.log | tail -24
[ -n "${NO_SERVE:-}" ] && exit 0
python3 -m llama_moe serve /tmp/q30.gguf --dry-run --api-key k3y --alias q30 --threads 16 2>&1 | tee $OUT/serve_plan.txt | tail -12
(python3 -m llama_moe serve /tmp/q30.gguf --api-key k3y --alias q30 --threads 16 --port 8088 > $OUT/serve.log 2>&1 &)
for i in $(seq 1 120); do curl -sf localhost:8088/health > /dev/null && break; sleep 1; done
echo "server up after ${i} s"
timeout 120 python3 -m llama_moe check-api --server http://127.0.0.1:8088 --api-key k3y --model q30 2>&1 | tee $OUT/check_api.txt | tail -12
curl -s localhost:8088/metrics -H "Authorization: Bearer k3y" | grep moe_cache | head -12
pkill -f llama-server; sleep 2; tail -5 $OUT/serve.log
