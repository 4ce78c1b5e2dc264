#!/usr/bin/env bash
# Call 2 on the H200 (same machine as h200_build.sh): every mode side by side at 25, 50 and 75% of the experts
# (the hybrids through the mailbox), llama.cpp's own split for the same VRAM and the all-in-VRAM ceiling.
set -u
. tests/gpu/h200_setup.sh
while pgrep -f "llama_moe synth" > /dev/null; do sleep 2; done
ls -la /tmp/q30.gguf
timeout 540 python3 -m llama_moe bench /tmp/q30.gguf -t 16 --runs 3 -n 128 --cache-pct 25 50 75 --json $OUT/bench.json \
    --md $OUT/bench.md --png $OUT/bench.png 2>&1 | tee $OUT/bench.log | tail -24
