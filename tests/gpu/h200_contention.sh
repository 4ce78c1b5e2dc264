#!/usr/bin/env bash
# After h200_bench.sh on the same machine: is the mailbox slowed by CPU threads competing for the cores (its
# own OpenMP team and the main graph's, both spinning between parallel regions, and the CUDA host thread)?
# The hybrid with and without the mailbox at 50%, with fewer threads and with OpenMP's spinning cut; then the
# trace-window trap with blocking launches (which kernel), and the reference's logit gaps where tokens part.
set -u
. tests/gpu/h200_setup.sh
b() { timeout 100 python3 -m llama_moe bench /tmp/q30.gguf --runs 2 -n 64 --cache-pct 50 --modes hybrid,hybrid-no-mailbox \
      --no-vram --profile /tmp/q30.strp "$@" 2>&1 | grep -E "hybrid.* cache .* MiB"; }
for v in "-t 8" "-t 12" "GOMP_SPINCOUNT=0 -t 16" "GOMP_SPINCOUNT=0 -t 12" "OMP_PROC_BIND=false GOMP_SPINCOUNT=20000 -t 15"; do
  echo "== $v"; envs=$(echo "$v" | grep -oE "[A-Z_]+=[^ ]+" | tr '\n' ' '); args=$(echo "$v" | grep -oE "\-t [0-9]+")
  env $envs bash -c "$(declare -f b); b $args"
done
for e in trace-long plain-u32-ctx4096 trace-u32-ctx4096; do
  r=$(CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 tests/gpu/h200_bisect.py /tmp/tiny.gguf $e 2>&1 | grep -E ": ok|CUDA error|in function|Error" | head -3 | tr '\n' ' ')
  echo "$e (blocking launches): $r"
done
python3 -c "
from pathlib import Path
from llama_moe.commands.bench import train_profile
train_profile(Path('/tmp/tiny.gguf'), Path('/tmp/tiny.strp'), log=lambda s: None, n_ctx=512)"
timeout 90 python3 tests/gpu/h200_margin.py /tmp/tiny.gguf /tmp/tiny.strp 24 2>&1 | grep -v "resolve_fused\|llama_model_loader"
