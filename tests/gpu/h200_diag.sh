#!/usr/bin/env bash
# Rebuild (incremental on a warm machine), then the prompt-copy check alone with blocking launches and the
# native log, then the generation equivalence of every mode.
set -u
. tests/gpu/h200_setup.sh
t0=$(date +%s)
python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real --tests 2>&1 | tail -2
echo "cuda build: $(( $(date +%s) - t0 )) s"
CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 tests/gpu/cuda_equivalence.py --prompt-only 2>&1 | grep -v "^/tmp\|^python3\|^/lib" | tail -20
timeout 200 python3 tests/gpu/cuda_equivalence.py -n 256 --no-prompt 2>&1 | tee $OUT/equivalence.txt | grep -v "^$" | tail -30
