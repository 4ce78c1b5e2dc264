#!/usr/bin/env bash
# The mailbox's ring, sticky abort and one-token-graph rule on an H200, in three calls on one machine (the build,
# the model and its profile stay in /tmp between calls while the machine is warm).
#   PART=1: the CUDA build; the mailbox's device checks on the tiny model (tests/gpu/mailbox_device.py); the
#           4096-token tracing trap with graphs off and blocking launches, then under compute-sanitizer.
#   PART=2: llama-server with 1, 2 and 4 requests at once on the Qwen3-30B-A3B shape at 50% of the experts:
#           the hybrid through the mailbox, through the scheduler, and --cpu-moe (tests/gpu/serve_parallel.py);
#           then one-stream bench of the hybrid at 50% against the earlier figure.
#   PART=3: the lifecycle loop under compute-sanitizer memcheck (tests/gpu/lifecycle_cuda.sh).
set -u
. tests/gpu/h200_fresh.sh
if [ "${PART:-1}" = 1 ]; then
  q30_synth
  cuda_build
  timeout $(left 420) python3 tests/gpu/mailbox_device.py -n 128 --timeout 90 2>&1 | tee $OUT/mailbox_device.md
  python3 -c "from llama_moe.synth import synthesize; synthesize('/tmp/tiny.gguf', shape='tiny', expert_type='q8_0', seed=0)"
  echo "== trap: graphs off, blocking launches"
  GGML_CUDA_DISABLE_GRAPHS=1 CUDA_LAUNCH_BLOCKING=1 timeout $(left 500) python3 tests/gpu/h200_bisect.py /tmp/tiny.gguf trace-long \
      > /tmp/trap_blocking.log 2>&1; echo "rc $?"
  grep -E "CUDA error|in function|: ok|current device|error:" /tmp/trap_blocking.log | head -8
  echo "== trap: compute-sanitizer"
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  GGML_CUDA_DISABLE_GRAPHS=1 timeout $(left 585) $san --tool memcheck --print-limit 5 python3 tests/gpu/h200_bisect.py /tmp/tiny.gguf trace-long \
      > /tmp/trap_sanitizer.log 2>&1; echo "rc $?"
  grep -E "=========|: ok|CUDA error" /tmp/trap_sanitizer.log | head -30
  cp /tmp/trap_*.log $OUT/ 2>/dev/null
elif [ "${PART}" = 2 ]; then
  cuda_build
  q30_profile
  for v in "NONE=1" "CUDA_LAUNCH_BLOCKING=1"; do
    env $v timeout 100 python3 tests/gpu/h200_bisect.py /tmp/tiny.gguf trace-long > /tmp/trap_graphs.log 2>&1
    echo "== trap with CUDA graphs ($v): rc $? $(grep -E 'CUDA error|in function|: ok' /tmp/trap_graphs.log | head -3 | tr '\n' ' ')"
  done
  LLAMA_MOE_MAILBOX_GPU_SHARE=0.5 timeout 60 python3 -m llama_moe -v stats 2>&1 | grep -iE "GPU_SHARE|host copy" | head -3
  timeout $(left 480) python3 tests/gpu/serve_parallel.py /tmp/q30.gguf --profile /tmp/q30.strp --cache-mib 7776 \
      --parallel 1,2,4 --configs hybrid,hybrid-no-mailbox,cpu-moe --rounds 3 -n 128 -t 16 2>&1 | tee $OUT/serve_parallel.md
  cp /tmp/serve_*.log "$OUT"/ 2>/dev/null
  q30_bench r50 4 50 hybrid
else
  cuda_build
  timeout $(left 585) env ITERATIONS=1 bash tests/gpu/lifecycle_cuda.sh 2>&1 | tail -8
fi
cp /tmp/*.md /tmp/*.json "$OUT"/ 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
