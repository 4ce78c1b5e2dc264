#!/usr/bin/env bash
# Call 1 on the H200 (about 9 min): synthesize the big model in the background, build for CUDA from the
# bundle, then the checks that need only the tiny model: equivalence of every cache mode with no cache (tokens
# over 256, teacher-forced logits where they part at a near tie, prompts whose experts come from the cache, the
# hybrid with and without the mailbox), check-all (its GPU checks: decoding with the cache in VRAM, llama-server
# through CUDA's mailbox), the 4096-token trace windows that trap on the tiny model; then on the big model
# the hybrid with and without the mailbox at 50% and 75% (issue 9). WITH_TESTS=1 also builds and runs
# test-backend-ops.
set -u
. tests/gpu/h200_fresh.sh
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
# the CPUs as OpenMP sees them (affinity) and as the kernel meters them (a cgroup quota): spinning threads
# past a quota stall the whole process, which would explain the mailbox's slow, erratic CPU parts
echo "cpus: nproc $(nproc), affinity $(python3 -c 'import os; print(len(os.sched_getaffinity(0)))'), cgroup cpu.max '$(cat /sys/fs/cgroup/cpu.max 2>/dev/null)'"
q30_synth
cuda_build ${WITH_TESTS:+--tests}
lib=$(ls -dt /tmp/lmcache/*-cuda | head -1)
python3 -m llama_moe info | head -12
t0=$(date +%s)
timeout 240 python3 tests/gpu/cuda_equivalence.py -n 256 2>&1 | grep -v "^/tmp\|^python3\|^/lib" | tee $OUT/equivalence.txt | tail -40
echo "equivalence: $(( $(date +%s) - t0 )) s"
# the installation's own checks, the GPU ones included: decoding with the cache in VRAM, llama-server through
# CUDA's mailbox and through the scheduler (the same text, audit logs that pass)
timeout 150 python3 -m llama_moe check-all -n 64 2>&1 | grep -E "^(PASS|FAIL|SKIP)|passed" | tee $OUT/check_all.txt
# the trap of 4096-token trace windows on the tiny model: without CUDA graphs, with blocking launches, the
# failing kernel's function is named
CUDA_LAUNCH_BLOCKING=1 EXPERIMENTS=trace-long VARIANTS=GGML_CUDA_DISABLE_GRAPHS=1 NOBUILD=1 timeout 90 bash tests/gpu/h200_bisect.sh 2>&1 | tail -3
[ -x $lib/test-backend-ops ] && $lib/test-backend-ops -o MUL_MAT_ID -b CUDA0 2>&1 | tail -2
q30_profile
timeout $(left 570) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 2 -n 128 --cache-pct 50 75 --modes hybrid,hybrid-no-mailbox \
    --no-vram --profile /tmp/q30.strp --json $OUT/bench_mailbox.json --md $OUT/bench_mailbox.md > $OUT/bench_mailbox.log 2>&1
grep -E "hand-overs from the GPU|hybrid.* cache .* MiB" $OUT/bench_mailbox.log | sed -E 's/^ +//'
echo "total: $(( $(date +%s) - T0 )) s"
