#!/usr/bin/env bash
# Correctness on an H200, in two calls on one machine (the build stays in /tmp while the machine is warm).
#   PART=1: the CUDA build; the lifecycle loop under compute-sanitizer memcheck (tests/gpu/lifecycle_cuda.sh);
#           one decode of every cache mode under memcheck, then the mailbox's modes under racecheck
#           (tests/gpu/modes_sanitize.py).
#   PART=2: the mailbox's device checks not run before (graphs and PDL both off, the GPU share's reason, about
#           10^6 send/receive rounds under load: tests/gpu/mailbox_device.py); every architecture's tiny model,
#           the cache on the GPU against no cache (tests/gpu/cuda_equivalence.py --arch), three at a time.
set -u
. tests/gpu/h200_fresh.sh
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ "${PART:-1}" = 1 ]; then
  cuda_build
  timeout $(left 330) env ITERATIONS=1 bash tests/gpu/lifecycle_cuda.sh 2>&1 | tail -6
  echo "== modes under memcheck: $(( $(date +%s) - T0 )) s"
  timeout $(left 470) $san --tool memcheck --print-limit 10 python3 tests/gpu/modes_sanitize.py -n 8 > $OUT/modes_memcheck.txt 2>&1
  echo "rc $?"; grep -E "^[a-z-]+: prompt|MODES|ERROR SUMMARY|=========  (Invalid|Program hit)" $OUT/modes_memcheck.txt | head -20
  echo "== mailbox modes under racecheck: $(( $(date +%s) - T0 )) s"
  timeout $(left 585) $san --tool racecheck --print-limit 10 python3 tests/gpu/modes_sanitize.py -n 4 --modes hybrid,gpu-reads-all \
      > $OUT/modes_racecheck.txt 2>&1
  echo "rc $?"; grep -E "^[a-z-]+: prompt|MODES|RACECHECK SUMMARY|ERROR SUMMARY|hazard" $OUT/modes_racecheck.txt | head -12
else
  cuda_build
  LITMUS_SECONDS=${LITMUS_SECONDS:-150} timeout $(left 300) python3 tests/gpu/mailbox_device.py --checks graphs-pdl,share,litmus \
      -n 128 --timeout 90 2>&1 | tee $OUT/mailbox_device.md
  echo "== architectures: $(( $(date +%s) - T0 )) s"
  archs=$(python3 -c "from llama_moe.synth.archs import CONFIGS; print(' '.join(CONFIGS))")
  mkdir -p /tmp/arch
  run_arch() {
    timeout 150 python3 tests/gpu/cuda_equivalence.py --arch $1 -n 64 --no-prompt --prompts 1 --pcts 50 \
        --modes upload,hybrid,hybrid-split,adaptive > /tmp/arch/$1.txt 2>&1
    echo "$1: rc $?, $(grep -c -- '-> ok' /tmp/arch/$1.txt) ok, $(grep -c WRONG /tmp/arch/$1.txt) wrong, $(tail -1 /tmp/arch/$1.txt | cut -c1-200)"
  }
  export -f run_arch
  echo $archs | tr ' ' '\n' | timeout $(left 585) xargs -P 3 -I{} bash -c 'run_arch {}' | sort | tee $OUT/architectures.md
  tar czf $OUT/arch_logs.tgz -C /tmp arch
fi
echo "total: $(( $(date +%s) - T0 )) s"
