#!/usr/bin/env bash
# One call on a fresh H200 (about 9.5 min; the 2026-11-29 run: the mailbox's thread split, n_threads - 1 for the
# mailbox and one for the rest of a one-token graph): the CUDA build, then on the Qwen3-30B-A3B shape the hybrid with and
# without the mailbox at 25/50/75% (issue 9), where the time goes with the mailbox, and on the tiny model the
# logit gaps where CUDA's greedy tokens part from the reference, and the trace-window trap with blocking launches.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
q30_profile
timeout $(left 450) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50 75 --modes hybrid,hybrid-no-mailbox \
    --no-vram --profile /tmp/q30.strp --json $OUT/bench_threads.json --md $OUT/bench_threads.md > $OUT/bench_threads.log 2>&1
grep -E "mailbox:|hybrid.* cache .* MiB" $OUT/bench_threads.log | tail -12
GGML_SCHED_PROFILE=1 timeout $(left 500) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 1 -n 64 --cache-pct 50 --modes hybrid \
    --no-vram --profile /tmp/q30.strp 2>&1 | grep -E "ggml_sched_profile|mailbox:|hybrid.* cache" | tee $OUT/sched_profile_threads.txt
python3 -c "from llama_moe.synth import synthesize; synthesize('/tmp/tiny.gguf', shape='tiny', expert_type='q8_0', seed=0)"
python3 -c "
from pathlib import Path
from llama_moe.bench.corpus_profile import train_profile
train_profile(Path('/tmp/tiny.gguf'), Path('/tmp/tiny.strp'), log=lambda s: None, n_ctx=512)"
timeout $(left 540) python3 tests/gpu/h200_margin.py /tmp/tiny.gguf /tmp/tiny.strp 24 2>&1 | grep -v "resolve_fused\|llama_model_loader"
for e in trace-long plain-u32-ctx4096 trace-u32-ctx4096; do
  r=$(CUDA_LAUNCH_BLOCKING=1 timeout $(left 585) python3 tests/gpu/h200_bisect.py /tmp/tiny.gguf $e 2>&1 | grep -E ": ok|CUDA error|in function|Error" | head -3 | tr '\n' ' ')
  echo "$e (blocking launches): $r"
done
echo "total: $(( $(date +%s) - T0 )) s"
