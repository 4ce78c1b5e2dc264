#!/usr/bin/env bash
# Call 1 on the H200: synthesize the big model in the background, build for CUDA from the bundle,
# then the checks that need only the tiny model.
set -u
. tests/gpu/h200_setup.sh
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
if ! pgrep -f "llama_moe synth" > /dev/null && [ ! -f /tmp/q30.gguf ]; then
  (setsid nohup nice python3 -m llama_moe synth /tmp/q30.gguf --shape qwen3-30b-a3b --experts q4_0 --quiet > /tmp/synth.log 2>&1 &)
fi
t0=$(date +%s)
python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real --tests 2>&1 | tail -4
echo "cuda build: $(( $(date +%s) - t0 )) s"
cat /tmp/lmcache/*-cuda/manifest.json | head -30
python3 -m llama_moe info | head -12
python3 tests/gpu/cuda_equivalence.py -n 256 2>&1 | tee $OUT/equivalence.txt | tail -12
/tmp/lmcache/*-cuda/test-backend-ops -o MUL_MAT_ID -b CUDA0 2>&1 | tail -3
tail -c 300 /tmp/synth.log
