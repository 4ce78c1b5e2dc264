#!/usr/bin/env bash
# On CUDA: tests/lifecycle/lifecycle_loop.c (models and contexts created and freed with every MoE cache
# mode, the cache in VRAM) under compute-sanitizer memcheck with full leak checking, then two faults: no GPU
# at start (CUDA_VISIBLE_DEVICES="") and the hybrid without experts in RAM. Needs the CUDA build of
# benchmarks/cuda/run.sh build (same machine), or LLAMA_MOE_LIB.
# Prints one verdict line at the end: "lifecycle_cuda: PASS ..." or "lifecycle_cuda: FAIL ...".
#   ITERATIONS=2 bash benchmarks/cuda/lifecycle_sanitize.sh
set -u
. benchmarks/cuda/lib.sh
ITERATIONS=${ITERATIONS:-2}
OUT=${OUT:-/tmp/out}
work=$(mktemp -d /tmp/lifecycle.XXXXXX)

lib=${LLAMA_MOE_LIB:-$(ls -t /tmp/lmcache/*-cuda/libllama.so 2>/dev/null | head -1)}
[ -d "$lib" ] && lib=$lib/libllama.so
if [ ! -f "$lib" ]; then echo "lifecycle_cuda: FAIL no CUDA libllama (run benchmarks/cuda/run.sh build first, or set LLAMA_MOE_LIB)"; exit 1; fi
libdir=$(dirname "$lib")
tree=$(dirname "$libdir")/work/cuda/llama.cpp
[ -f "$tree/include/llama.h" ] || tree=/tmp/lmcache/work/cuda/llama.cpp
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -z "$sanitizer" ]; then echo "lifecycle_cuda: FAIL compute-sanitizer not found"; exit 1; fi

# the driver, without ASan (it and compute-sanitizer do not mix), against the CUDA library
gcc -g -O1 -I"$tree/include" -I"$tree/ggml/include" tests/lifecycle/lifecycle_loop.c -o "$work/lifecycle_loop" \
    -L"$libdir" -lllama -lggml -lggml-base -Wl,-rpath,"$libdir" || { echo "lifecycle_cuda: FAIL cannot build the driver"; exit 1; }

# the tiny model and a profile for it
python3 tests/lifecycle/make_inputs.py "$work" || { echo "lifecycle_cuda: FAIL cannot make the tiny model"; exit 1; }

# the loop under memcheck: the cache on the GPU (no LIFECYCLE_CACHE_DEVICE)
unset LIFECYCLE_CACHE_DEVICE
t0=$(date +%s)
"$sanitizer" --tool memcheck --leak-check full --error-exitcode 3 --print-limit 20 \
    "$work/lifecycle_loop" "$work/tiny.gguf" "$work/tiny.strp" "$ITERATIONS" > "$work/memcheck.txt" 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
cp "$work/memcheck.txt" "$OUT/lifecycle_memcheck.txt"
grep -E "lifecycle_loop:|ERROR SUMMARY|LEAK SUMMARY|Leaked|bytes leaked" "$work/memcheck.txt" | tail -8
errors=$(grep -oE "ERROR SUMMARY: [0-9]+ errors?$" "$work/memcheck.txt" | grep -oE "[0-9]+" | head -1)
leaked=$(grep -cE "Leaked [0-9]+ bytes" "$work/memcheck.txt")
cycles=$(grep -oE "[0-9]+ model\+context cycles" "$work/memcheck.txt" | grep -oE "^[0-9]+")

# an unavailable GPU at start: the cache asked for, no device to hold it
CUDA_VISIBLE_DEVICES="" python3 -m llama_moe stats "$work/tiny.gguf" --moe-cache-mib 2 --no-repack -n 4 > "$work/nogpu.txt" 2>&1
nogpu_rc=$?
cp "$work/nogpu.txt" "$OUT/lifecycle_nogpu.txt"
nogpu=$(grep -m1 -E "no GPU to hold the cache|no device" "$work/nogpu.txt")

# the hybrid without any experts in RAM (no --cpu-moe): every expert is in VRAM, nothing to cache
python3 -m llama_moe stats "$work/tiny.gguf" --no-cpu-moe --moe-cache-mib 2 --moe-cache-hybrid \
    --moe-cache-profile "$work/tiny.strp" -n 4 > "$work/noram.txt" 2>&1
noram_rc=$?
cp "$work/noram.txt" "$OUT/lifecycle_noram.txt"
noram=$(grep -m1 -o "no layer has its experts in RAM" "$work/noram.txt")

verdict=PASS
[ "$rc" -eq 0 ] && [ "${errors:-x}" = 0 ] && [ "$leaked" -eq 0 ] && [ -n "$cycles" ] || verdict=FAIL
[ "$nogpu_rc" -eq 0 ] && [ -n "$nogpu" ] && [ "$noram_rc" -eq 0 ] && [ -n "$noram" ] || verdict=FAIL
echo "lifecycle_cuda: $verdict memcheck rc=$rc, ${cycles:-0} model+context cycles in $secs s, ${errors:-?} errors, $leaked leak reports;" \
     "CUDA_VISIBLE_DEVICES='' -> rc=$nogpu_rc, '${nogpu:-no message}'; hybrid without --cpu-moe -> rc=$noram_rc, '${noram:-no message}'"
[ "$verdict" = PASS ]
