#!/usr/bin/env bash
# Call 2 on the H200 (a fresh machine, about 9 min): the build and the model as in h200_build.sh, then the
# equivalence (every mode against no cache; the mailbox against the scheduler, bit for bit), serve sized to
# the free VRAM answering through the official OpenAI and Anthropic clients (issue 8), and the mailbox's CPU
# part with 15, 12 and 8 threads in fresh processes (its exit lines: the part's time, its expert products'
# bandwidth; issue 9).
set -u
. tests/gpu/h200_fresh.sh
echo "cpus: nproc $(nproc), affinity $(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')"
q30_synth
cuda_build
t0=$(date +%s)
timeout 120 python3 tests/gpu/cuda_equivalence.py -n 256 2>&1 | grep -E "^'|^prompt|EQUIVALENT|DIFFERENT" | tee $OUT/equivalence.txt \
    | grep -E "mailbox against|WRONG|EQUIVALENT|DIFFERENT|^prompt"
echo "equivalence: $(( $(date +%s) - t0 )) s"
q30_profile
NO_ADAPTIVE=1 timeout 150 bash tests/gpu/h200_serve.sh
for t in 15 12 8; do
  LLAMA_MOE_MAILBOX_THREADS=$t timeout $(left 590) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 1 -n 64 --cache-pct 50 \
      --modes hybrid --no-vram --profile /tmp/q30.strp > $OUT/threads_$t.log 2>&1
  echo "mailbox threads $t:"; grep -E "mailbox: |hybrid .*cache" $OUT/threads_$t.log | grep -v "layers hand over" | sed -E 's/^ +//'
done
echo "total: $(( $(date +%s) - T0 )) s"
