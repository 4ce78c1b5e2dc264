#!/usr/bin/env bash
# The admitting hybrid on an H200, in two calls on one machine (the second while it is warm: the build, the
# models, the profile and the marks of the steps done stay in /tmp). Each call runs, in order, the steps not yet
# done while its clock allows (DEADLINE seconds after its start), then packs /tmp/admit into $OUT.
#   build, profile   the CUDA build (the Qwen3-30B-A3B-shaped model synthesized beside it), the hybrids' profile
#   b50              at 50%: hybrid (mailbox), hybrid-admit (bench's default budget), hybrid-adaptive, --cpu-moe,
#                    all in VRAM; RUNS runs of 128 tokens
#   b50a4            at 50%: hybrid-admit with 4 admissions per layer and decode (tests/gpu/bench_admit.py)
#   b25              at 25%: hybrid against hybrid-admit
#   tiny             the tiny model (q8_0, seed 0) and its profile, outside the sanitizer
#   memcheck         compute-sanitizer memcheck over one short decode of the admitting hybrid, through the
#                    mailbox and through the scheduler (tests/gpu/modes_sanitize.py --modes admit,admit-split)
#   eq_tiny, eq_gpt  cuda_equivalence.py on the tiny and gpt-oss-tiny models, the admitting modes included
#   trap             the 4096-token trap: llama-bench -p 4096 -ub 32 with CUDA graphs and a GPU core dump read by
#                    cuda-gdb (the faulting kernel), then the traced corpus (h200_bisect.py trace-long) with
#                    GGML_CUDA_DISABLE_GRAPHS=1 CUDA_LAUNCH_BLOCKING=1
#   serve            llama-server, the mailbox hybrid at 50%, 1, 2 and 4 requests at once (serve_parallel.py)
set -u
. tests/gpu/h200_fresh.sh
DEADLINE=${DEADLINE:-510}
RUNS=${RUNS:-8}
PART=${PART:-1}
R=/tmp/admit
mkdir -p $R
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
cgdb=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
mark() { touch $R/done_$1; }
fits() {  # STEP SECONDS: the step is not done yet and SECONDS are left before DEADLINE
  [ -f $R/done_$1 ] && return 1
  local l=$(left $DEADLINE)
  [ $l -ge $2 ] && { echo "== $1 (part $PART) at $(( $(date +%s) - T0 )) s, $l s left"; return 0; }
  echo "== $1 skipped in part $PART: $l s left, needs $2"; return 1
}
cap() { local l=$(left $DEADLINE); echo $(( l < $1 ? l : $1 )); }  # a step's timeout: at most $1, within DEADLINE
bench() {  # NAME ADMIT PCTS MODES
  local name=$1 admit=$2 pcts=$3 modes=$4
  timeout $(left $DEADLINE) python3 tests/gpu/bench_admit.py --admit $admit -v bench /tmp/q30.gguf -t 16 --runs $RUNS \
      -n 128 --cache-pct $pcts --modes $modes --profile /tmp/q30.strp --json $R/$name.json --md $R/$name.md > $R/$name.log 2>&1
  local rc=$?
  echo "rc $rc at $(( $(date +%s) - T0 )) s"
  grep -E "tok/s, pp|hits of|admission:|admits up to|the CPU waited|had nothing" $R/$name.log | sed -E 's/^ +//' | cut -c1-260
  [ $rc = 0 ] && mark $name
}

echo "part $PART: $(date -u +%FT%TZ), deadline $DEADLINE s; $(nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader)"
q30_synth
cuda_build 2>&1 | tee -a $R/build.log
if [ ! -f /tmp/q30.strp ]; then q30_profile | tee -a $R/build.log; fi

if fits b50 150; then bench b50 1 50 hybrid,hybrid-admit,hybrid-adaptive,cpu-moe,vram; fi
if fits b50a4 50; then bench b50a4 4 50 hybrid-admit; fi
if fits b25 90; then bench b25 1 25 hybrid,hybrid-admit; fi
if fits tiny 30; then
  timeout $(cap 60) python3 -c "
from pathlib import Path
from llama_moe.synth import synthesize
from llama_moe.bench.corpus_profile import train_profile
synthesize('/tmp/tiny.gguf', shape='tiny', expert_type='q8_0', seed=0)
train_profile(Path('/tmp/tiny.gguf'), Path('/tmp/tiny.strp'), log=lambda s: None, n_ctx=512)" > $R/tiny.log 2>&1 \
      && mark tiny; tail -2 $R/tiny.log
fi
if [ -f $R/done_tiny ] && fits memcheck 100; then
  timeout $(cap 240) $san --tool memcheck --print-limit 10 python3 tests/gpu/modes_sanitize.py -n 16 --modes admit,admit-split \
      --model /tmp/tiny.gguf --profile /tmp/tiny.strp > $R/memcheck.txt 2>&1
  echo "rc $?"; grep -E "^[a-z-]+: prompt|MODES|ERROR SUMMARY|=========  (Invalid|Program hit)" $R/memcheck.txt | head -12
  grep -q "ERROR SUMMARY" $R/memcheck.txt && mark memcheck
fi
for s in tiny gpt-oss-tiny; do
  if fits eq_$s 60; then
    timeout $(cap 120) python3 tests/gpu/cuda_equivalence.py --shape $s --experts q8_0 -n 128 --no-prompt --pcts 25,50 \
        --modes upload,hybrid,adaptive,admit,admit4,admit-split > $R/eq_$s.txt 2>&1
    echo "rc $?: $(grep -c -- '-> ok' $R/eq_$s.txt) ok, $(grep -c WRONG $R/eq_$s.txt) wrong; $(tail -1 $R/eq_$s.txt | cut -c1-200)"
    grep WRONG $R/eq_$s.txt | head -3
    grep -qE "^(EQUIVALENT|DIFFERENT)" $R/eq_$s.txt && mark eq_$s
  fi
done
if [ -f $R/done_tiny ] && fits trap 45; then
  lb=$(ls /tmp/lmcache/*-cuda/llama-bench | head -1)
  rm -f /tmp/trap.cudacore*
  CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION=0 CUDA_COREDUMP_FILE=/tmp/trap.cudacore \
      CUDA_COREDUMP_GENERATION_FLAGS=skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory \
      timeout $(cap 60) $lb -m /tmp/tiny.gguf -p 4096 -b 32 -ub 32 -n 0 -r 1 -ngl 99 > $R/trap_llama_bench_graphs.log 2>&1
  echo "llama-bench -p 4096 -ub 32 -ngl 99, graphs on: rc $? $(grep -E 'CUDA error|in function|pp4096' $R/trap_llama_bench_graphs.log | head -2 | tr '\n' ' ' | cut -c1-300)"
  ls -la /tmp/trap.cudacore* 2>&1 | head -2
  if ls /tmp/trap.cudacore* > /dev/null 2>&1; then
    timeout $(cap 60) $cgdb -batch -ex "target cudacore $(ls /tmp/trap.cudacore* | head -1)" -ex "info cuda kernels" -ex "bt" \
        -ex 'x/8i $pc-64' -ex 'x/4i $pc' > $R/trap_cudagdb.log 2>&1
    echo "cuda-gdb rc $?"; grep -vE "^$|^warning|^\[New|^Copyright|^License|^This GDB|free software|no warranty|^Type \"|^For bug|documentation resources|^Find the GDB|^    <http" $R/trap_cudagdb.log | head -24 | cut -c1-300
  fi
  GGML_CUDA_DISABLE_GRAPHS=1 CUDA_LAUNCH_BLOCKING=1 timeout $(cap 90) python3 tests/gpu/h200_bisect.py /tmp/tiny.gguf trace-long \
      > $R/trap_trace_long_nographs_blocking.log 2>&1
  echo "trace-long, GGML_CUDA_DISABLE_GRAPHS=1 CUDA_LAUNCH_BLOCKING=1: rc $? $(grep -E 'CUDA error|in function|: ok' $R/trap_trace_long_nographs_blocking.log | head -2 | tr '\n' ' ' | cut -c1-300)"
  mark trap
fi
if fits serve 70; then
  timeout $(cap 200) python3 tests/gpu/serve_parallel.py /tmp/q30.gguf --profile /tmp/q30.strp --cache-mib 7776 \
      --parallel 1,2,4 --configs hybrid --rounds 3 -n 128 -t 16 --log-dir $R > $R/serve_parallel.md 2> $R/serve_parallel.err
  echo "rc $?"; cat $R/serve_parallel.md | cut -c1-400; tail -3 $R/serve_parallel.err
  grep -q "^| hybrid | 4" $R/serve_parallel.md && mark serve
fi

echo "== table (part $PART, $(( $(date +%s) - T0 )) s)"
grep -hE "built:|up to date:.*cuda" $R/build.log | tail -1
for f in b50 b50a4 b25; do [ -f $R/$f.md ] && grep -E "^\| (hybrid|all|cpu)" $R/$f.md | sed "s/^/$f /"; done
[ -f $R/memcheck.txt ] && echo "memcheck: $(grep -E 'ERROR SUMMARY' $R/memcheck.txt | tail -1)"
for s in tiny gpt-oss-tiny; do [ -f $R/eq_$s.txt ] && echo "eq $s: $(grep -c -- '-> ok' $R/eq_$s.txt) ok, $(grep -c WRONG $R/eq_$s.txt) wrong, $(tail -1 $R/eq_$s.txt | cut -c1-80)"; done
ls $R/done_* 2>/dev/null | sed 's|.*/done_||' | tr '\n' ' '; echo "(steps done)"
tar czf $OUT/admit_part$PART.tgz -C /tmp admit
echo "total: $(( $(date +%s) - T0 )) s"
