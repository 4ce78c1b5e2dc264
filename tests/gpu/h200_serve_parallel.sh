#!/usr/bin/env bash
# One call on a fresh H200: llama-server with 4 requests decoding at once on the Qwen3-30B-A3B shape, --cpu-moe
# against the hybrid and upload caches at 50% of the experts (tests/gpu/serve_parallel.py), with the cache's
# counters (refused lookups among them) from /metrics.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
q30_profile
timeout $(left 590) python3 tests/gpu/serve_parallel.py /tmp/q30.gguf --profile /tmp/q30.strp --cache-mib 7776 \
    --parallel 4 --rounds 3 -n 128 -t 16 2>&1 | tee $OUT/serve_parallel.md
cp /tmp/serve_*.log "$OUT"/ 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
