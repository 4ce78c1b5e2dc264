#!/usr/bin/env bash
# The shortest CUDA check of the mailbox and the MMQ repeat fix: a lib-only build without flash attention
# (fastest), then tests/gpu/h200_quick.py on the tiny model.
set -u
. tests/gpu/h200_setup.sh
t0=$(date +%s)
python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real --lib-only \
    --cmake-arg=-DGGML_CUDA_FA=OFF 2>&1 | tail -1
echo "cuda build: $(( $(date +%s) - t0 )) s"
python3 -c "from llama_moe.synth import synthesize; synthesize('/tmp/tiny.gguf', shape='tiny', expert_type='q8_0', seed=0)"
timeout 60 python3 tests/gpu/h200_quick.py /tmp/tiny.gguf 2>&1 | grep -v "^/tmp\|^python3\|^/lib\|^#" | tee $OUT/quick.txt | grep -E "IDENTICAL|DIFFER|mailbox|error|Error|none:" | head -20
