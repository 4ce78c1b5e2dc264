#!/usr/bin/env bash
# One call on a fresh H200 (about 9.5 min), the 2026-11-30 run (issue 9): where the hybrid's one-token decode spends
# its device time against all in VRAM. ncu times every kernel (CUDA graphs off, so each is its own launch) of
# one_token_kernels.py with 1 and with 3 tokens after the prompt; ncu_diff.py gives the 2 tokens between.
# The mailbox with the CPU computing every miss (LLAMA_MOE_MAILBOX_GPU_SHARE=0), 50% of the experts cached.
# Then the hand-over alone (LLAMA_MOE_MAILBOX_TEST_EMPTY=1), now that steps without CPU rows do not wait.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
q30_profile
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
k() { # mode n
  GGML_CUDA_DISABLE_GRAPHS=1 LLAMA_MOE_MAILBOX_GPU_SHARE=0 timeout $(left 500) $NCU --clock-control none \
      --metrics gpu__time_duration.sum --csv python3 tests/gpu/one_token_kernels.py /tmp/q30.gguf --mode $1 \
      --profile /tmp/q30.strp -n $2 > /tmp/ncu_$1_$2.csv 2> /tmp/ncu_$1_$2.err
  echo "ncu $1 $2: rc $?, $(grep -c gpu__time_duration /tmp/ncu_$1_$2.csv) kernels, $(( $(date +%s) - T0 )) s"
  tail -2 /tmp/ncu_$1_$2.err
}
for m in hybrid vram; do
  k $m 1
  k $m 3
  python3 tests/gpu/ncu_diff.py /tmp/ncu_${m}_1.csv /tmp/ncu_${m}_3.csv 2
done
q30_bench empty 5 50 hybrid,vram LLAMA_MOE_MAILBOX_TEST_EMPTY=1 LLAMA_MOE_MAILBOX_GPU_SHARE=0
tar czf $OUT/runs.tgz /tmp/*.csv /tmp/*.err /tmp/*.log /tmp/*.md 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
