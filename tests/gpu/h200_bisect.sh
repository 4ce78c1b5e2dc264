#!/usr/bin/env bash
# Which configuration raises "CUDA error: an illegal instruction" (a device-side trap)? Each experiment runs in
# its own process, with and without CUDA graphs.
set -u
. tests/gpu/h200_setup.sh
if [ -z "${NOBUILD:-}" ]; then
  t0=$(date +%s)
  python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real --lib-only 2>&1 | tail -1
  echo "cuda build: $(( $(date +%s) - t0 )) s"
fi
python3 -c "from llama_moe.synth import synthesize; synthesize('/tmp/tiny.gguf', shape='tiny', expert_type='q8_0', seed=0)"
for e in ${EXPERIMENTS:-trace-512 trace-long hybrid-u16 hybrid-pinned-u1}; do
  for v in ${VARIANTS:-NONE=1}; do
    r=$(env $v timeout 60 python3 tests/gpu/h200_bisect.py /tmp/tiny.gguf $e 2>&1 | grep -E ": ok|CUDA error|in function|Error" | head -3 | tr '\n' ' ')
    echo "$e $v: $r"
  done
done
[ -z "${NOBUILD:-}" ] && timeout 100 python3 tests/gpu/cuda_equivalence.py /tmp/tiny.gguf -n 256 --no-prompt 2>&1 | grep -E "tokens|EQUIV|DIFF|CUDA error" | tail -12
