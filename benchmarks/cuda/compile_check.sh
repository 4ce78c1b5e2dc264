#!/usr/bin/env bash
# Compiles the series' CUDA sources with nvcc for sm_90, without a GPU and without a whole CUDA build: for a
# machine that has nvcc but not the CUDA libraries a full configure needs. cuBLAS's headers are enough
# (`pip download --no-deps nvidia-cublas` and unzip its include/ folder).
#
#   python build_native.py --dev /tmp/dev && CUBLAS_INCLUDE=.../nvidia/cu13/include bash benchmarks/cuda/compile_check.sh /tmp/dev
set -u
tree=${1:?usage: compile_check.sh DEV_TREE (python build_native.py --dev DEV_TREE)}
inc=${CUBLAS_INCLUDE:?CUBLAS_INCLUDE: a folder with cublas_v2.h}
out=$(mktemp -d)
ok=0
# the CUDA files the series changes or adds
for f in $(cd "$tree" && git diff --name-only "$(git rev-list --max-parents=0 HEAD)" HEAD -- 'ggml/src/ggml-cuda/*.cu'); do
  if nvcc -std=c++17 -arch=sm_90 -c "$tree/$f" -o "$out/$(basename "$f").o" -I"$tree/ggml/include" -I"$tree/ggml/src" \
      -I"$tree/ggml/src/ggml-cuda" -I"$inc" -DGGML_USE_CUDA -DGGML_CUDA_USE_GRAPHS -DGGML_SCHED_MAX_COPIES=4 -DNDEBUG -O1; then
    echo "$f: compiles"
  else
    echo "$f: FAILED"; ok=1
  fi
done
rm -rf "$out"
exit $ok
