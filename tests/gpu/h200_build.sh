#!/usr/bin/env bash
# Call 1 on the H200 (about 9 min): synthesize the big model in the background, build for CUDA from the
# bundle, then the checks that need only the tiny model: equivalence of every cache mode with no cache (tokens
# over 256, teacher-forced logits where they part at a near tie, prompts whose experts come from the cache, the
# hybrid with and without the mailbox); then on the big model the hybrid with and without the mailbox beside
# upload mode at 25, 50 and 75% (issues 4 and 9), and the mailbox's time profile at 50% as long as the call
# has time. WITH_TESTS=1 also builds and runs test-backend-ops.
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
[ -x $lib/test-backend-ops ] && $lib/test-backend-ops -o MUL_MAT_ID -b CUDA0 2>&1 | tail -2
q30_profile
timeout $(left 540) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 2 -n 128 --cache-pct 25 50 75 --modes upload,hybrid,hybrid-no-mailbox \
    --no-vram --profile /tmp/q30.strp --json $OUT/bench_mailbox.json --md $OUT/bench_mailbox.md > $OUT/bench_mailbox.log 2>&1
grep -E "hand-overs from the GPU|hybrid.* cache .* MiB|RAM read|host to device" $OUT/bench_mailbox.log | sed -E 's/^ +//'
cat $OUT/bench_mailbox.md
# where a token's time goes through the mailbox, as long as the call has time
GGML_SCHED_PROFILE=1 timeout $(left 590) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 1 -n 64 --cache-pct 50 --modes hybrid \
    --no-vram --profile /tmp/q30.strp > $OUT/sched_profile.txt 2>&1
grep -E "ggml_sched_profile|hand-overs" $OUT/sched_profile.txt | tail -12
echo "total: $(( $(date +%s) - T0 )) s"
