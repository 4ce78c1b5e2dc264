#!/usr/bin/env bash
# One call on a fresh H200 (about 9 min): the build and the model as in h200_build.sh, the equivalence (every
# mode against no cache; the mailbox against the scheduler, bit for bit), serve sized to the free VRAM
# answering through the official OpenAI and Anthropic clients (issue 8), then `--cpu-moe` and every cached
# mode side by side at 25, 50 and 75% (issues 4, 8, 9), with the mailbox's exit lines.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
t0=$(date +%s)
timeout 120 python3 tests/gpu/cuda_equivalence.py -n 256 2>&1 | grep -E "^'|^prompt|EQUIVALENT|DIFFERENT" > $OUT/equivalence.txt
grep -E "mailbox against|EQUIVALENT|DIFFERENT" $OUT/equivalence.txt | cut -c1-160
echo "equivalence: $(( $(date +%s) - t0 )) s"
q30_profile
NO_ADAPTIVE=1 timeout 100 bash tests/gpu/h200_serve.sh
timeout $(left 575) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50 75 \
    --modes cpu-moe,upload,hybrid,hybrid-no-mailbox,hybrid-adaptive --no-vram --profile /tmp/q30.strp \
    --json $OUT/bench.json --md $OUT/bench.md --png $OUT/bench.png > $OUT/bench.log 2>&1
grep -E "mailbox: the CPU|mailbox: a part|RAM read|host to device" $OUT/bench.log | sed -E 's/^ +//'
cat $OUT/bench.md
echo "total: $(( $(date +%s) - T0 )) s"
