#!/usr/bin/env bash
# Call 5 on the H200 (same machine, after the others): the gpt-oss-120b-shaped model
# (MXFP4 experts, about 61 GB). The Qwen3-30B-A3B-shaped file goes first: the disk holds 64 GiB.
set -u
. tests/gpu/h200_setup.sh
rm -f /tmp/q30.gguf
df -h /tmp | tail -1
t0=$(date +%s)
python3 -m llama_moe synth /tmp/goss.gguf --shape gpt-oss-120b --experts mxfp4 --quiet 2>&1 | tail -2
echo "synth: $(( $(date +%s) - t0 )) s"; ls -la /tmp/goss.gguf
timeout 420 python3 -m llama_moe bench /tmp/goss.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50 \
    --modes cpu-moe,upload,hybrid,hybrid-adaptive --json $OUT/bench_goss.json --md $OUT/bench_goss.md 2>&1 \
    | tee $OUT/bench_goss.log | tail -14
