#!/usr/bin/env bash
# The device trap of tracing in 4096-token windows on the tiny model: with CUDA graphs only (graphs off and
# compute-sanitizer find nothing). Without the trace, every logit or the last; llama-bench's prompt of 4096 in
# 32-token ubatches; then, with BASE=1, the same llama-bench on the plain base (no patches) built here.
set -u
. tests/gpu/h200_fresh.sh
cuda_build > /dev/null
[ -f /tmp/tiny.gguf ] || python3 -c "from llama_moe.synth import synthesize; synthesize('/tmp/tiny.gguf', shape='tiny', expert_type='q8_0', seed=0)"
for e in plain-long plain-long-last; do
  timeout 100 python3 tests/gpu/h200_bisect.py /tmp/tiny.gguf $e > /tmp/trap_$e.log 2>&1
  echo "$e: rc $? $(grep -E 'CUDA error|in function|: ok' /tmp/trap_$e.log | head -2 | tr '\n' ' ')"
done
bench() {
  for a in "-ngl 99" "-ngl 99 -ncmoe 99"; do
    timeout 60 $1 -m /tmp/tiny.gguf -p 4096 -b 32 -ub 32 -n 0 -r 1 $a > /tmp/trap_bench.log 2>&1
    echo "$2 llama-bench -p 4096 -ub 32 $a: rc $? $(grep -E 'CUDA error|in function|pp4096|error' /tmp/trap_bench.log | head -2 | tr '\n' ' ')"
  done
}
bench "$(ls /tmp/lmcache/*-cuda/llama-bench | head -1)" patched
if [ -n "${BASE:-}" ]; then
  mkdir -p /tmp/plain && tar xJf .bundle/llama.cpp-0c1e57098.tar.xz -C /tmp/plain
  src=$(dirname "$(find /tmp/plain -maxdepth 3 -name CMakeLists.txt -path '*llama*' | head -1)")
  cmake -S "$src" -B /tmp/plain/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/plain_cmake.log 2>&1 || tail -5 /tmp/plain_cmake.log
  timeout $(left 540) cmake --build /tmp/plain/build --target llama-bench -j 16 > /tmp/plain_build.log 2>&1 || tail -5 /tmp/plain_build.log
  echo "plain base build: $(( $(date +%s) - T0 )) s"
  bench /tmp/plain/build/bin/llama-bench base
fi
cp /tmp/trap_*.log "$OUT"/ 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
