#!/usr/bin/env bash
# The one entry point of the CUDA measurements, for a lent GPU machine with a copy of the checkout, the trimmed
# source bundle in .bundle/ (python build_native.py --bundle .bundle/llama.cpp-0c1e57098.tar.xz) and the wheels
# the machine lacks in .whl/ (README.md). It runs the STEPS given, in order, each while DEADLINE seconds after
# its start allow, marks each step done in /tmp/cuda-run, and skips steps already done: a second call on the same
# warm machine resumes where the first stopped. Everything a step writes is under /tmp/cuda-run, packed into
# $OUT/run.tgz at the end; a short table is printed last.
#
#   STEPS="build speed memcheck equivalence" DEADLINE=540 bash benchmarks/cuda/run.sh
#
# Steps:
#   build        the CUDA build (CUDA_ARCH, default 90-real), the big model of BIG synthesized beside it: qwen3-30b-a3b
#                (the default, Q4_0 experts, 16.8 GB) or gpt-oss-120b (MXFP4 experts, 61 GB); the disk holds one
#   big          waits for the big model, then the hybrids' profile from a third of each topic's paragraphs
#   tiny         the tiny model (q8_0, seed 0) and its profile
#   speed        python -m llama_moe bench on the big model: for each "PCT:MODES[:N[:R]]" of SPEED (default
#                "50:hybrid,hybrid-admit,hybrid-adaptive,cpu-moe,vram 25:hybrid,hybrid-admit"), RUNS runs of 128
#                tokens; N (default ADMIT, 1) the admitting hybrid's uploads per layer and decode, R (default 0)
#                the decodes between its moves of slots between layers (bench_admit.py)
#   memcheck     compute-sanitizer memcheck over one short decode of each cache mode (sanitize_modes.py)
#   racecheck    compute-sanitizer racecheck over the mailbox's modes, the mailbox's kernels and MMVQ's only (the
#                other kernels run uninstrumented: racecheck over every kernel does not finish within a call)
#   lifecycle    the lifecycle loop under memcheck with leak checking (lifecycle_sanitize.sh)
#   equivalence  every cache mode against no cache on the tiny and gpt-oss-tiny models (equivalence.py)
#   split        upload mode's split on the device against the replay of the engine's trace (split_lookups.py)
#   archs        the same on every architecture's tiny model (llama_moe.tools.synth.archs), three at a time, each
#                held to its own device tolerance (all in VRAM against no cache)
#   mailbox      the mailbox's device checks (mailbox_device.py; MAILBOX_CHECKS, default all)
#   trap         llama-bench -p 4096 -ub 32 with CUDA graphs, a GPU core dump read by cuda-gdb (the faulting
#                kernel), then the traced corpus with graphs off and blocking launches
#   serve        llama-server with 1, 2 and 4 requests at once, the hybrid through the mailbox (serve_parallel.py;
#                the Qwen3 shape's cache of half its experts)
#   kernels      ncu's time of every kernel of one-token decoding, hybrid against all in VRAM (one_token_kernels.py)
#   profile      where one token's time goes at PROFILE_PCT (default 50) % of the experts, the hybrid against all in
#                VRAM, each in its own process: GGML_SCHED_PROFILE's compute, copies and waits per graph shape,
#                and the mailbox's exit lines (the CPU's waits and parts)
#   rates        one core's rate of the CPU part's expert-row products (MXFP4, Q4_0, Q8_0) in L2 and from RAM,
#                beside a plain read (benchmarks/vec_dot_rates.c against the build's ggml-cpu)
#   ramtier      the RAM tier (experts read from the model's file into locked RAM, the rest on the GPU) against no
#                tier on the tiny and gpt-oss-tiny models (equivalence.py --ram-tier)
#   probe        where the adaptive hybrid's counted hits are computed: its logits against no cache's, with and
#                without the mailbox, beside slots filled by admit_experts (adaptive_probe.py)
#   poison       where the hybrid's counted hits are computed, told apart without comparing kernels: the file's bytes
#                of the cached experts zeroed after the slots are filled (adaptive_probe.py --poison), on the tiny
#                and the wide model (the probe step writes the wide one)
#   tiers        three tiers (the device cache over the RAM tier) in upload, hybrid, admitting and adaptive mode against no
#                cache on the tiny and gpt-oss-tiny models (equivalence.py --three-tiers)
#   tierspeed    the hybrid's decode on the big model with VRAM%:RAM% of the experts in the two tiers and the rest read
#                from the file, against the hybrid without a tier (tiers_speed.py; TIERS, default 50:0,50:25,50:50,25:25)
#   tierfree     the same with RAM made scarce (tiers_speed.py --free-gib; FREE_GIB, default 6; TIERS_FREE, default
#                50:0,50:25): the hybrid whose other experts are mapped against the three tiers, with the same RAM
#   spec         speculative decoding on the big model through llama-server, all in VRAM and the hybrid at half its experts,
#                without drafts, with n-gram drafts and with a 2-layer draft model of the same shape (spec_speed.py)
#   auto         the cache's auto size and mode against hand-picked modes at the size auto chose, with the GPU's memory
#                made scarce by a balloon (auto_speed.py; VRAM_FREE_GIB, default 10)
#   batch        several sequences at once (a 154-token prompt beside a short one) in every cache mode against
#                the same batch without a cache, on the tiny model (equivalence.py --batch)
set -u
here=benchmarks/cuda
. $here/lib.sh
DEADLINE=${DEADLINE:-540}
RUNS=${RUNS:-8}
ADMIT=${ADMIT:-1}
SPEED=${SPEED:-"50:hybrid,hybrid-admit,hybrid-adaptive,cpu-moe,vram 25:hybrid,hybrid-admit"}
STEPS=${STEPS:-"build speed memcheck equivalence"}
BIG=${BIG:-qwen3-30b-a3b}
case $BIG in
  qwen3-30b-a3b) M=/tmp/q30.gguf; EXPERTS=q4_0 ;;
  gpt-oss-120b) M=/tmp/g120.gguf; EXPERTS=mxfp4 ;;
  *) echo "BIG is qwen3-30b-a3b or gpt-oss-120b, not $BIG"; exit 2 ;;
esac
P=${M%.gguf}.strp
R=/tmp/cuda-run
mkdir -p $R
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
cgdb=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
mark() { touch $R/done_$1; }
fits() {  # STEP SECONDS: not done yet, and SECONDS are left before DEADLINE
  [ -f $R/done_$1 ] && return 1
  local l=$(left $DEADLINE)
  [ $l -ge $2 ] && { echo "== $1 at $(( $(date +%s) - T0 )) s, $l s left"; return 0; }
  echo "== $1 skipped: $l s left, needs $2"; return 1
}
cap() { local l=$(left $DEADLINE); echo $(( l < $1 ? l : $1 )); }

step_build() {
  if [ ! -f $M ] && ! pgrep -f "llama_moe synth" > /dev/null; then
    rm -f /tmp/q30.gguf /tmp/g120.gguf  # the disk holds one big model
    (setsid nohup nice python3 -m llama_moe synth $M --shape $BIG --experts $EXPERTS --quiet > $R/synth.log 2>&1 &)
  fi
  python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch ${CUDA_ARCH:-90-real} --tests 2>&1 \
      | tail -2 | tee -a $R/build.log
  grep -q "built:\|up to date" $R/build.log && mark build
}
step_big() {
  while pgrep -f "llama_moe synth" > /dev/null && [ $(left $DEADLINE) -gt 30 ]; do sleep 2; done
  [ -f $M ] || { echo "the big model is still being written ($(du -sh /tmp/.*.tmp-* 2>/dev/null | cut -f1))"; return; }
  [ -f $P ] || timeout $(cap ${PROFILE_SECONDS:-150}) python3 -c "
from pathlib import Path
from llama_moe.tools.bench.corpus_profile import train_profile
train_profile(Path('$M'), Path('$P'), stride=3)"
  [ -f $P ] && mark big
}
step_tiny() {
  timeout $(cap 60) python3 -c "
from pathlib import Path
from llama_moe.tools.synth import synthesize
from llama_moe.tools.bench.corpus_profile import train_profile
synthesize('/tmp/tiny.gguf', shape='tiny', expert_type='q8_0', seed=0)
train_profile(Path('/tmp/tiny.gguf'), Path('/tmp/tiny.strp'), log=lambda s: None, n_ctx=512)" > $R/tiny.log 2>&1 && mark tiny
}
step_speed() {
  local ok=1
  for item in $SPEED; do
    local pct modes admit repart
    IFS=: read -r pct modes admit repart <<< "$item"
    admit=${admit:-$ADMIT}
    repart=${repart:-0}
    local name=speed_${pct}_a$admit
    [ $repart = 0 ] || name=${name}_r$repart
    [ -f $R/done_$name ] && continue
    timeout $(left $DEADLINE) python3 $here/bench_admit.py --admit $admit --repartition $repart -v bench $M -t 16 --runs $RUNS \
        -n 128 --cache-pct $pct --modes $modes --profile $P --json $R/$name.json --md $R/$name.md > $R/$name.log 2>&1 \
        && mark $name || ok=0
    grep -E "tok/s, pp|hits of|admission|re-partition|the CPU waited" $R/$name.log | sed -E 's/^ +//' | cut -c1-260
  done
  [ $ok = 1 ] && mark speed
}
step_memcheck() {
  timeout $(cap 300) $san --tool memcheck --print-limit 10 python3 $here/sanitize_modes.py -n 8 \
      --model /tmp/tiny.gguf --profile /tmp/tiny.strp > $R/memcheck.txt 2>&1
  grep -E "MODES|ERROR SUMMARY|=========  (Invalid|Program hit)" $R/memcheck.txt | head -12
  grep -q "ERROR SUMMARY" $R/memcheck.txt && mark memcheck
}
step_racecheck() {
  timeout $(cap ${RACECHECK_SECONDS:-400}) $san --tool racecheck --print-limit 10 --kernel-regex kns='mailbox|mul_mat_vec_q' python3 \
      $here/sanitize_modes.py -n 4 --modes hybrid,gpu-reads-all,admit --model /tmp/tiny.gguf --profile /tmp/tiny.strp \
      > $R/racecheck.txt 2>&1
  grep -E "MODES|RACECHECK SUMMARY|ERROR SUMMARY|hazard" $R/racecheck.txt | head -12
  grep -q "SUMMARY" $R/racecheck.txt && mark racecheck
}
step_lifecycle() {
  timeout $(cap 330) env ITERATIONS=1 OUT=$R bash $here/lifecycle_sanitize.sh > $R/lifecycle.txt 2>&1
  tail -3 $R/lifecycle.txt; grep -q "lifecycle_cuda: PASS" $R/lifecycle.txt && mark lifecycle
}
step_equivalence() {
  for s in tiny gpt-oss-tiny; do
    timeout $(cap 200) python3 $here/equivalence.py --shape $s --experts q8_0 -n 128 --no-prompt --pcts 25,50 \
        --modes upload,hybrid,adaptive,admit,admit4,admit-auto,admit-sync,admit-split,admit-repart,admit-repart-sync > $R/eq_$s.txt 2>&1
    echo "$s: $(grep -c -- '-> ok' $R/eq_$s.txt) ok, $(grep -c WRONG $R/eq_$s.txt) wrong; $(tail -1 $R/eq_$s.txt | cut -c1-160)"
  done
  grep -qE "^(EQUIVALENT|DIFFERENT)" $R/eq_gpt-oss-tiny.txt && mark equivalence
}
step_split() {
  timeout $(cap 120) python3 $here/split_lookups.py /tmp/tiny.gguf > $R/split_lookups.txt 2>&1
  echo "split_lookups: rc $?; $(tail -1 $R/split_lookups.txt | cut -c1-200)"
  grep -q "^SPLIT" $R/split_lookups.txt && mark split
}
step_archs() {
  mkdir -p $R/arch
  run_arch() {
    timeout 150 python3 benchmarks/cuda/equivalence.py --arch $1 -n 64 --no-prompt --prompts 1 --pcts 50 \
        --modes upload,hybrid,hybrid-split,adaptive,adaptive-profile,admit > /tmp/cuda-run/arch/$1.txt 2>&1
    echo "$1: rc $?, $(grep -c -- '-> ok' /tmp/cuda-run/arch/$1.txt) ok, $(grep -c WRONG /tmp/cuda-run/arch/$1.txt) wrong"
  }
  export -f run_arch
  python3 -c "from llama_moe.tools.synth.archs import CONFIGS; print('\n'.join(CONFIGS))" \
      | timeout $(left $DEADLINE) xargs -P 3 -I{} bash -c 'run_arch {}' | sort | tee $R/archs.md
  mark archs
}
step_mailbox() {
  timeout $(cap ${MAILBOX_SECONDS:-400}) python3 $here/mailbox_device.py --checks ${MAILBOX_CHECKS:-stall,ring,graphs-pdl,no-pinned,two-contexts,share,litmus} \
      -n 128 --timeout 120 > $R/mailbox_device.md 2>&1
  grep -E "ok$|WRONG|MAILBOX DEVICE" $R/mailbox_device.md | cut -c1-200
  grep -q "MAILBOX DEVICE" $R/mailbox_device.md && mark mailbox
}
step_trap() {
  local lb=$(ls /tmp/lmcache/*-cuda/llama-bench | head -1)
  rm -f /tmp/trap.cudacore*
  CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION=0 CUDA_COREDUMP_FILE=/tmp/trap.cudacore \
      CUDA_COREDUMP_GENERATION_FLAGS=skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory \
      timeout $(cap 60) $lb -m /tmp/tiny.gguf -p 4096 -b 32 -ub 32 -n 0 -r 1 -ngl 99 > $R/trap_llama_bench.log 2>&1
  echo "llama-bench -p 4096 -ub 32 -ngl 99: rc $?"
  if ls /tmp/trap.cudacore* > /dev/null 2>&1; then
    timeout $(cap 60) $cgdb -batch -ex "target cudacore $(ls /tmp/trap.cudacore* | head -1)" -ex "info cuda kernels" \
        -ex "bt" > $R/trap_cudagdb.log 2>&1
    grep -E "sm[0-9]+_|kernel|Illegal" $R/trap_cudagdb.log | head -6 | cut -c1-300
  fi
  GGML_CUDA_DISABLE_GRAPHS=1 CUDA_LAUNCH_BLOCKING=1 timeout $(cap 90) python3 $here/cuda_error_hunt.py /tmp/tiny.gguf trace-long \
      > $R/trap_trace_long_nographs.log 2>&1
  echo "traced corpus, graphs off, blocking launches: rc $?"
  mark trap
}
step_serve() {
  timeout $(cap 200) python3 $here/serve_parallel.py $M --profile $P --cache-mib 7776 \
      --parallel 1,2,4 --configs ${SERVE_CONFIGS:-hybrid,upload} --rounds 3 -n 128 -t 16 --log-dir $R > $R/serve_parallel.md 2> $R/serve_parallel.err
  cut -c1-300 $R/serve_parallel.md
  grep -q "^| hybrid | 4" $R/serve_parallel.md && mark serve
}
step_kernels() {
  for m in hybrid vram; do
    for n in 1 3; do
      GGML_CUDA_DISABLE_GRAPHS=1 timeout $(cap 120) $ncu --clock-control none --metrics gpu__time_duration.sum --csv \
          python3 $here/one_token_kernels.py $M --mode $m --profile $P -n $n > $R/ncu_${m}_$n.csv 2> $R/ncu_${m}_$n.err
    done
    python3 $here/ncu_diff.py $R/ncu_${m}_1.csv $R/ncu_${m}_3.csv 2 | tail -12
  done
  mark kernels
}

step_profile() {
  local ok=1 rc
  for m in hybrid vram; do
    GGML_SCHED_PROFILE=1 timeout $(cap 200) python3 $here/bench_admit.py --admit 1 --repartition 0 -v bench $M -t 16 \
        --runs 1 -n 64 --pp 512 --cache-pct ${PROFILE_PCT:-50} --modes $m --profile $P > $R/profile_$m.log 2>&1
    rc=$?
    echo "$m: rc $rc"
    [ $rc = 0 ] || ok=0
    grep -E "ggml_sched_profile|the CPU waited|tok/s, pp" $R/profile_$m.log | sed -E 's/^ +//' | cut -c1-300
  done
  [ $ok = 1 ] && mark profile
}
step_rates() {
  local B=/tmp/lmcache/work/cuda
  gcc -O2 -march=native -o /tmp/vd benchmarks/vec_dot_rates.c -I$B/llama.cpp/ggml/include -L$B/build/bin -lggml-cpu \
      -lggml-base -Wl,-rpath,$B/build/bin && timeout $(cap 60) taskset -c 3 /tmp/vd | tee $R/rates.txt
  grep -q "^q8_0" $R/rates.txt && mark rates
}
step_ramtier() {
  for s in tiny gpt-oss-tiny; do
    timeout $(cap 150) python3 $here/equivalence.py --shape $s --experts q8_0 -n 128 --ram-tier --pcts 25,50 > $R/ramtier_$s.txt 2>&1
    echo "ram tier, $s: $(grep -c -- '-> ok' $R/ramtier_$s.txt) ok, $(grep -c WRONG $R/ramtier_$s.txt) wrong; $(tail -1 $R/ramtier_$s.txt | cut -c1-160)"
  done
  grep -qE "^(EQUIVALENT|DIFFERENT)" $R/ramtier_gpt-oss-tiny.txt && mark ramtier
}
step_tiers() {
  for s in tiny gpt-oss-tiny; do
    timeout $(cap 150) python3 $here/equivalence.py --shape $s --experts q8_0 -n 96 --three-tiers --pcts 25,50 --prompts 2 \
        > $R/tiers_$s.txt 2>&1
    echo "three tiers, $s: $(grep -c -- '-> ok' $R/tiers_$s.txt) ok, $(grep -c WRONG $R/tiers_$s.txt) wrong; $(tail -1 $R/tiers_$s.txt | cut -c1-160)"
  done
  grep -qE "^(EQUIVALENT|DIFFERENT)" $R/tiers_gpt-oss-tiny.txt && mark tiers
}
step_tierspeed() {
  timeout $(cap 300) python3 $here/tiers_speed.py $M --profile $P -n 128 --settings ${TIERS:-50:0,50:25,50:50,25:25} \
      > $R/tierspeed.txt 2>&1
  grep -E "^\|" $R/tierspeed.txt
  local want=${TIERS:-50:0,50:25,50:50,25:25}
  [ $(grep -c "^| [0-9]*% | [0-9]*% |" $R/tierspeed.txt) = $(echo $want | tr ',' '\n' | wc -l) ] && mark tierspeed
}
step_tierfree() {
  timeout $(cap 400) python3 $here/tiers_speed.py $M --profile $P -n 128 --settings ${TIERS_FREE:-50:0,50:25} \
      --free-gib ${FREE_GIB:-6} > $R/tierfree.txt 2>&1
  grep -E "^\||^each" $R/tierfree.txt
  local want=${TIERS_FREE:-50:0,50:25}
  [ $(grep -c "^| [0-9]*% | [0-9]*% |" $R/tierfree.txt) = $(echo $want | tr ',' '\n' | wc -l) ] && mark tierfree
}
step_probe() {
  # the tiny model, and a wide one whose rows the GPU sums in another order than the CPU, each with the control
  timeout $(cap 90) python3 -c "
from pathlib import Path
from llama_moe.tools.synth import synthesize
from llama_moe.tools.bench.corpus_profile import train_profile
synthesize('/tmp/wide.gguf', shape='tiny,n_embd=1024,n_ff_exp=1024', expert_type='q8_0', seed=0)
train_profile(Path('/tmp/wide.gguf'), Path('/tmp/wide.strp'), log=lambda s: None, n_ctx=512)" > $R/wide.log 2>&1
  for m in tiny wide; do
    timeout $(cap 120) python3 $here/adaptive_probe.py /tmp/$m.gguf --profile /tmp/$m.strp > $R/probe_$m.txt 2>&1
    echo "probe, $m:"; grep -vE "^    layer|Warning|with Context" $R/probe_$m.txt | cut -c1-250 | tail -8
  done
  grep -q "PROBE: DONE" $R/probe_wide.txt && mark probe
}
step_poison() {
  [ -f /tmp/wide.strp ] || { echo "poison needs the probe step's wide model"; return; }
  for m in tiny wide; do
    timeout $(cap 120) python3 $here/adaptive_probe.py /tmp/$m.gguf --profile /tmp/$m.strp --poison -n 32 > $R/poison_$m.txt 2>&1
    echo "poison, $m:"; grep -vE "Warning|with Context" $R/poison_$m.txt | cut -c1-250 | tail -7
  done
  grep -q "^POISON: " $R/poison_wide.txt && mark poison
}
step_spec() {
  [ -f /tmp/draft.gguf ] || timeout $(cap 120) python3 -c "
from llama_moe.tools.synth import synthesize
synthesize('/tmp/draft.gguf', 'qwen3-30b-a3b,n_layer=2', 'q4_0', seed=0)" > $R/draft.log 2>&1
  timeout $(cap 400) python3 $here/spec_speed.py $M --profile $P --cache-mib 7776 --draft /tmp/draft.gguf \
      --configs vram,hybrid --specs none,ngram,draft --rounds 3 -n 128 -t 16 --log-dir $R > $R/spec.md 2> $R/spec.err
  cut -c1-200 $R/spec.md
  grep -q "^| hybrid | draft" $R/spec.md && mark spec
}
step_auto() {
  timeout $(cap 400) python3 $here/auto_speed.py $M --profile $P --free-gib ${VRAM_FREE_GIB:-10} -n 128 > $R/auto.md 2> $R/auto.err
  cut -c1-300 $R/auto.md; tail -3 $R/auto.err
  grep -q "^| upload" $R/auto.md && mark auto
}
step_batch() {
  timeout $(cap 200) python3 $here/equivalence.py --shape tiny --experts q8_0 -n 48 --batch \
      --modes upload,hybrid,hybrid-split,adaptive,admit,admit-sync,admit-repart > $R/batch.txt 2>&1
  echo "batch: $(grep -c -- '-> ok' $R/batch.txt) ok, $(grep -c WRONG $R/batch.txt) wrong; $(tail -1 $R/batch.txt | cut -c1-160)"
  grep -qE "^(EQUIVALENT|DIFFERENT)" $R/batch.txt && mark batch
}

declare -A NEED=([tiers]=120 [tierspeed]=150 [build]=240 [big]=60 [tiny]=30 [speed]=150 [memcheck]=100 [racecheck]=200 [lifecycle]=150 [equivalence]=120 [split]=60
                 [archs]=200 [mailbox]=200 [trap]=60 [serve]=90 [kernels]=240
                 [profile]=120 [batch]=90 [rates]=30 [ramtier]=60 [probe]=40 [poison]=60 [tierfree]=150 [spec]=200 [auto]=200)
echo "$(date -u +%FT%TZ), deadline $DEADLINE s, steps: $STEPS; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for s in $STEPS; do
  [ -z "${NEED[$s]:-}" ] && { echo "unknown step $s (steps: ${!NEED[*]})"; exit 2; }
  case $s in memcheck|racecheck|trap|equivalence|split|probe|poison) [ -f $R/done_tiny ] || { fits tiny 30 && step_tiny; } ;; esac
  case $s in speed|serve|kernels|profile|tierspeed|tierfree|spec|auto) [ -f $R/done_big ] || { fits big 60 && step_big; } ;; esac
  if fits $s ${NEED[$s]}; then step_$s; fi
done
echo "== table ($(( $(date +%s) - T0 )) s)"
grep -hE "built:|up to date:.*cuda" $R/build.log 2>/dev/null | tail -1
for f in $R/speed_*.md; do [ -f $f ] && grep -E "^\| (hybrid|all|cpu|upload)" $f | sed "s|^|$(basename $f .md) |"; done
[ -f $R/memcheck.txt ] && echo "memcheck: $(grep -E 'ERROR SUMMARY' $R/memcheck.txt | tail -1)"
ls $R/done_* 2>/dev/null | sed 's|.*/done_||' | tr '\n' ' '; echo "(steps done)"
tar czf ${OUT:-/tmp/out}/run.tgz -C /tmp cuda-run
echo "total: $(( $(date +%s) - T0 )) s"
