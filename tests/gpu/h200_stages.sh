#!/usr/bin/env bash
# The 2026-11-30 plan in stages that survive between calls on one machine (markers in /tmp/stages): run
# the same command back to back until it prints "all stages done". A stage starts only when the call has the
# time it needs left (each call is cut at 590 s); else the call ends with "run this again".
#   gpt-oss-120b shape (issue 8): the model (MXFP4, 61 GB) written while the build runs; the hybrids' profile
#   from a third of the train paragraphs; then bench in three runs whose JSON rows `bench --merge` joins:
#   cpu-moe + all in VRAM, llama.cpp's split, the cached modes at 25 and 50%; the mailbox on a tiny gpt-oss
#   against the scheduler, bit for bit.
#   Qwen3-30B-A3B shape (issue 9; the disk holds one model, so the big one goes first): the mailbox's parts at
#   50% with rows prefetched 4 KiB ahead or not, in chunks of 32, 16 or 8 rows or a slice per thread, each with
#   its exit lines; then the hybrid with and without the mailbox, adaptive too, against all in VRAM, 3 runs.
set -u
. tests/gpu/h200_fresh.sh
S=/tmp/stages; mkdir -p $S
need() { # need SECONDS STAGE: true when the stage is still to run and SECONDS are left of this call
  [ -f $S/$2.done ] && return 1
  if [ $(left 590) -lt $1 ]; then echo "stage $2 needs ${1} s, $(left 590) s left: run this again"; finish; exit 0; fi
  echo "== stage $2 at $(( $(date +%s) - T0 )) s"; return 0
}
done_() { touch $S/$1.done; }
finish() { # what comes back (at most 8 files: these and the plot)
  for f in bench_goss.json bench_goss.md goss_equivalence.md goss_a.json goss_b.json bench50.json bench50.md; do
    [ -f $S/$f ] && cp $S/$f $OUT/
  done
  echo "total: $(( $(date +%s) - T0 )) s"
}

if [ ! -f $S/goss.done ]; then
  rm -f /tmp/q30.gguf
  if [ ! -f /tmp/goss.gguf ] && ! pgrep -f "synth /tmp/goss" > /dev/null; then
    (setsid nohup python3 -m llama_moe synth /tmp/goss.gguf --shape gpt-oss-120b --experts mxfp4 --quiet > /tmp/goss_synth.log 2>&1 &)
  fi
fi
cuda_build
if need 60 goss_equiv; then
  timeout 120 python3 tests/gpu/cuda_equivalence.py --shape gpt-oss-tiny --experts mxfp4 -n 128 --no-prompt 2>&1 \
      | grep -E "^'|EQUIVALENT|DIFFERENT|Error" > $S/goss_equivalence.md
  grep -E "mailbox against|EQUIVALENT|DIFFERENT|Error" $S/goss_equivalence.md | cut -c1-170
  done_ goss_equiv
fi
if [ ! -f $S/goss.done ]; then
  while pgrep -f "synth /tmp/goss" > /dev/null; do
    if [ $(left 590) -lt 260 ]; then echo "the model is still being written ($(du -h /tmp/goss.gguf | cut -f1)): run this again"; finish; exit 0; fi
    sleep 2
  done
  tail -1 /tmp/goss_synth.log
fi
if need 250 goss_profile; then
  timeout $(left 585) python3 -c "
from pathlib import Path
from llama_moe.bench.corpus_profile import train_profile
train_profile(Path('/tmp/goss.gguf'), Path('/tmp/goss.strp'), stride=3)" && done_ goss_profile
fi
B="python3 -m llama_moe -v bench /tmp/goss.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50"
if need 200 goss_a; then
  timeout $(left 585) $B --modes cpu-moe,vram --json $S/goss_a.json > $S/goss_a.log 2>&1 && done_ goss_a
  grep -E "RAM read|host to device|decode" $S/goss_a.log | sed -E 's/^ +//'
fi
if need 240 goss_b; then
  timeout $(left 585) $B --modes n-cpu-moe --no-vram --json $S/goss_b.json > $S/goss_b.log 2>&1 && done_ goss_b
  grep -E "decode" $S/goss_b.log | sed -E 's/^ +//'
fi
if need 400 goss_c; then
  timeout $(left 585) $B --modes upload,hybrid,hybrid-no-mailbox,hybrid-adaptive --no-vram --profile /tmp/goss.strp \
      --json $S/goss_c.json > $S/goss_c.log 2>&1 && done_ goss_c
  grep -E "mailbox: the CPU|mailbox: a part|decode" $S/goss_c.log | sed -E 's/^ +//'
fi
if need 5 goss; then
  python3 -m llama_moe bench --merge $S/goss_a.json $S/goss_b.json $S/goss_c.json --json $S/bench_goss.json \
      --md $S/bench_goss.md --png $OUT/bench_goss.png > /dev/null && cat $S/bench_goss.md && done_ goss
  rm -f /tmp/goss.gguf
fi

if need 280 q30; then
  rm -f /tmp/goss.gguf
  q30_synth
  q30_profile && done_ q30
fi
for v in "4096 32" "0 32" "4096 16" "4096 8" "4096 0"; do
  set -- $v
  if need 45 part_$1_$2; then
    LLAMA_MOE_MAILBOX_PREFETCH=$1 GGML_MMID_CHUNK=$2 timeout 120 python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 1 -n 64 \
        --cache-pct 50 --modes hybrid --no-vram --profile /tmp/q30.strp > $S/part_$1_$2.log 2>&1 && done_ part_$1_$2
    echo "prefetch $1 chunk $2: $(grep -E "mailbox: a part" $S/part_$1_$2.log | sed -E 's/.*took //')"
    grep -E "hybrid .*cache" $S/part_$1_$2.log | sed -E 's/^ +//'
  fi
done
if need 200 bench50; then
  timeout $(left 585) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 3 -n 128 --cache-pct 50 \
      --modes hybrid,hybrid-adaptive,hybrid-no-mailbox,vram --profile /tmp/q30.strp --json $S/bench50.json \
      --md $S/bench50.md > $S/bench50.log 2>&1 && done_ bench50
  grep -E "mailbox: the CPU|mailbox: a part" $S/bench50.log | sed -E 's/^ +//'; cat $S/bench50.md
fi
echo "all stages done"
finish
