#!/usr/bin/env bash
# The gpt-oss-120b-shaped model (MXFP4 experts, about 61 GB; the Qwen3-30B-A3B-shaped file goes first: the
# disk holds 64 GiB) in every mode (issue 8). On a fresh machine it builds while the model is written in the
# background; if the model is not done 300 s after the start it stops, and the same command again (back to
# back, the same machine) waits for it and goes on. The hybrids' profile comes from a third of the train
# paragraphs (tracing a model this size is slow).
set -u
. tests/gpu/h200_fresh.sh
rm -f /tmp/q30.gguf
df -h /tmp | tail -1
if [ ! -f /tmp/goss.gguf ] && ! pgrep -f "synth /tmp/goss" > /dev/null; then
  (setsid nohup python3 -m llama_moe synth /tmp/goss.gguf --shape gpt-oss-120b --experts mxfp4 --quiet > /tmp/goss_synth.log 2>&1 &)
fi
cuda_build
while pgrep -f "synth /tmp/goss" > /dev/null; do
  if [ $(left 300) -le 1 ]; then echo "the model is still being written ($(du -h /tmp/goss.gguf | cut -f1)): run this again"; exit 0; fi
  sleep 2
done
cat /tmp/goss_synth.log | tail -2; ls -la /tmp/goss.gguf
echo "model ready: $(( $(date +%s) - T0 )) s after the start"
timeout $(left 585) python3 -m llama_moe -v bench /tmp/goss.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50 \
    --profile-stride 3 --modes cpu-moe,n-cpu-moe,upload,hybrid,hybrid-no-mailbox,hybrid-adaptive,vram \
    --json $OUT/bench_goss.json --md $OUT/bench_goss.md --png $OUT/bench_goss.png > $OUT/bench_goss.log 2>&1
grep -E "profile:|mailbox: the CPU|mailbox: a part|RAM read|host to device" $OUT/bench_goss.log | tail -14
cat $OUT/bench_goss.md 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
