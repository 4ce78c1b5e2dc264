#!/usr/bin/env bash
# Call 2 on the H200 (same machine as h200_build.sh): the big model generates with n_cpu_moe, then the
# benchmark of every mode at 25, 50 and 75% of the experts, and the all-in-VRAM ceiling.
set -u
. tests/gpu/h200_setup.sh
while pgrep -f "llama_moe synth" > /dev/null; do sleep 2; done
ls -la /tmp/q30.gguf
python3 -m llama_moe stats /tmp/q30.gguf --n-cpu-moe 24 -n 64 -t 16 2>&1 | head -9 | tee $OUT/stats_ncmoe.txt
python3 -m llama_moe bench /tmp/q30.gguf -t 16 --runs 2 --cache-pct 25 50 75 --json $OUT/bench.json --md $OUT/bench.md 2>&1 \
    | tee $OUT/bench.log | tail -20
# where a generated token's time goes, hybrid at 50% (issue 4): GPU, CPU, and the hand-overs between them
GGML_SCHED_PROFILE=1 python3 -m llama_moe bench /tmp/q30.gguf -t 16 --runs 1 -n 64 --cache-pct 50 --modes hybrid 2>&1 \
    | grep -E "ggml_sched_profile|hybrid" | tee $OUT/sched_profile.txt
