#!/usr/bin/env bash
# Call 5 on the H200 (same machine, after the others): the gpt-oss-120b-shaped model (MXFP4 experts, about
# 61 GB; the Qwen3-30B-A3B-shaped file goes first: the disk holds 64 GiB). The hybrids' profile comes from a
# third of the train paragraphs (tracing a model this size is slow); the all-in-VRAM ceiling is left out.
set -u
. tests/gpu/h200_setup.sh
T0=$(date +%s); left() { local s=$(( ${1} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
rm -f /tmp/q30.gguf
df -h /tmp | tail -1
python3 -m llama_moe synth /tmp/goss.gguf --shape gpt-oss-120b --experts mxfp4 --quiet 2>&1 | tail -2
echo "synth: $(( $(date +%s) - T0 )) s"; ls -la /tmp/goss.gguf
timeout $(left 585) python3 -m llama_moe -v bench /tmp/goss.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50 --no-vram \
    --profile-stride 3 --modes cpu-moe,upload,hybrid,hybrid-no-mailbox --json $OUT/bench_goss.json --md $OUT/bench_goss.md \
    > $OUT/bench_goss.log 2>&1
grep -E "profile:|mailbox: the CPU|RAM read|host to device|cache .* MiB" $OUT/bench_goss.log | tail -14
cat $OUT/bench_goss.md 2>/dev/null
