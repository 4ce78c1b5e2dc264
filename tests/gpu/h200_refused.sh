#!/usr/bin/env bash
# One call on a fresh H200 (about 5 min): the library alone, built for CUDA, then the upload cache's refused
# lookups with the cache in VRAM (tests/gpu/cuda_refused.py).
set -u
. tests/gpu/h200_setup.sh
T0=$(date +%s)
python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real --lib-only 2>&1 | tail -2
echo "cuda build: $(( $(date +%s) - T0 )) s"
timeout 240 python3 tests/gpu/cuda_refused.py 2>&1 | grep -v "^$" | tail -20
echo "total: $(( $(date +%s) - T0 )) s"
