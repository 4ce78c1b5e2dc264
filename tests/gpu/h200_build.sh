#!/usr/bin/env bash
# Call 1 on the H200: synthesize the big model in the background, build for CUDA from the bundle, then the
# checks that need only the tiny model: equivalence of every cache mode with no cache (tokens over 256 and
# logits, prompts whose experts come from the cache, the hybrid with and without the mailbox), and the
# 4096-token trace windows that end in a device trap on the tiny model. WITH_TESTS=1 also builds and runs test-backend-ops.
set -u
. tests/gpu/h200_setup.sh
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
# the CPUs as OpenMP sees them (affinity) and as the kernel meters them (a cgroup quota): spinning threads
# past a quota stall the whole process, which would explain the mailbox's slow, erratic CPU parts
echo "cpus: nproc $(nproc), affinity $(python3 -c 'import os; print(len(os.sched_getaffinity(0)))'), cgroup cpu.max '$(cat /sys/fs/cgroup/cpu.max 2>/dev/null)'"
if ! pgrep -f "llama_moe synth" > /dev/null && [ ! -f /tmp/q30.gguf ]; then
  (setsid nohup nice python3 -m llama_moe synth /tmp/q30.gguf --shape qwen3-30b-a3b --experts q4_0 --quiet > /tmp/synth.log 2>&1 &)
fi
t0=$(date +%s)
python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real ${WITH_TESTS:+--tests} 2>&1 | tail -4
echo "cuda build: $(( $(date +%s) - t0 )) s"
lib=$(ls -dt /tmp/lmcache/*-cuda | head -1)
python3 -m llama_moe info | head -12
t0=$(date +%s)
timeout 240 python3 tests/gpu/cuda_equivalence.py -n 256 2>&1 | grep -v "^/tmp\|^python3\|^/lib" | tee $OUT/equivalence.txt | tail -40
echo "equivalence: $(( $(date +%s) - t0 )) s"
# the trap of 4096-token trace windows on the tiny model: without CUDA graphs, with blocking launches, the
# failing kernel's function is named
CUDA_LAUNCH_BLOCKING=1 EXPERIMENTS=trace-long VARIANTS=GGML_CUDA_DISABLE_GRAPHS=1 NOBUILD=1 timeout 90 bash tests/gpu/h200_bisect.sh 2>&1 | tail -3
[ -x $lib/test-backend-ops ] && $lib/test-backend-ops -o MUL_MAT_ID -b CUDA0 2>&1 | tail -2
tail -c 300 /tmp/synth.log; ls -la /tmp/q30.gguf 2>/dev/null
