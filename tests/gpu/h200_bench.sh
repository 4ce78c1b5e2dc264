#!/usr/bin/env bash
# Call 2 on the H200 (same machine as h200_build.sh): every mode side by side at 25, 50 and 75% of the experts
# (the hybrid through the mailbox and through llama.cpp's scheduler), llama.cpp's own split for the same VRAM
# and the all-in-VRAM ceiling. The hybrids' profile is h200_build.sh's (a third of the train paragraphs), or made
# here from all of them, and kept in /tmp/q30.strp for the calls after this one.
set -u
. tests/gpu/h200_setup.sh
while pgrep -f "llama_moe synth" > /dev/null; do sleep 2; done
ls -la /tmp/q30.gguf
t0=$(date +%s)
[ -f /tmp/q30.strp ] || python3 -c "
from pathlib import Path
from llama_moe.bench.corpus_profile import train_profile
train_profile(Path('/tmp/q30.gguf'), Path('/tmp/q30.strp'))" 2>&1 | tail -3
echo "profile: $(( $(date +%s) - t0 )) s"
timeout ${BENCH_TIMEOUT:-480} python3 -m llama_moe bench /tmp/q30.gguf -t 16 --runs 3 -n 128 --cache-pct 25 50 75 \
    --modes cpu-moe,n-cpu-moe,upload,hybrid,hybrid-no-mailbox,hybrid-adaptive,vram --profile /tmp/q30.strp \
    --json $OUT/bench.json --md $OUT/bench.md --png $OUT/bench.png 2>&1 | tee $OUT/bench.log | tail -30
