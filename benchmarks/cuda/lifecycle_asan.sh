#!/usr/bin/env bash
# The lifecycle loop (tests/lifecycle/lifecycle_loop.c) with libllama and ggml themselves built with
# AddressSanitizer (a CPU build, LLAMA_SANITIZE_ADDRESS and GGML_SANITIZE_ADDRESS), so that every load and
# store inside them is checked, not only the allocations that CI's run (tests/binding/test_lifecycle.py, the library
# uninstrumented) sees. No GPU needed, but 16 cores build it in minutes: run it on the H200 machine.
# Prints one verdict line at the end: "lifecycle_asan: PASS ..." or "lifecycle_asan: FAIL ...".
set -u
. benchmarks/cuda/lib.sh
OUT=${OUT:-/tmp/out}
export LLAMA_MOE_CACHE_DIR=/tmp/asancache  # not the machine's normal build
work=$(mktemp -d /tmp/lifecycle_asan.XXXXXX)

t0=$(date +%s)
python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cpu --lib-only \
    --cmake-arg=-DLLAMA_SANITIZE_ADDRESS=ON --cmake-arg=-DGGML_SANITIZE_ADDRESS=ON > "$work/build.txt" 2>&1
echo "asan build: $(( $(date +%s) - t0 )) s"
lib=$(ls -t /tmp/asancache/*-cpu/libllama.so 2>/dev/null | head -1)
if [ -z "$lib" ]; then tail -20 "$work/build.txt"; echo "lifecycle_asan: FAIL the build"; exit 1; fi
libdir=$(dirname "$lib")
tree=/tmp/asancache/work/cpu/llama.cpp
gcc -g -O1 -fsanitize=address -fno-omit-frame-pointer -I"$tree/include" -I"$tree/ggml/include" \
    tests/lifecycle/lifecycle_loop.c -o "$work/lifecycle_loop" -L"$libdir" -lllama -lggml -lggml-base -lggml-cpu \
    -Wl,-rpath,"$libdir" || { echo "lifecycle_asan: FAIL cannot build the driver"; exit 1; }
python3 tests/lifecycle/make_inputs.py "$work" || { echo "lifecycle_asan: FAIL cannot make the tiny model"; exit 1; }

verdict=PASS
summary=""
for n in 1 ${ITERATIONS:-5}; do
    t0=$(date +%s)
    LIFECYCLE_CACHE_DEVICE=CPU ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:exitcode=0:fast_unwind_on_malloc=0 \
        "$work/lifecycle_loop" "$work/tiny.gguf" "$work/tiny.strp" "$n" > "$work/out$n.txt" 2> "$work/err$n.txt"
    rc=$?
    cp "$work/err$n.txt" "$OUT/lifecycle_asan_$n.txt"
    cat "$work/out$n.txt"
    errors=$(grep -c "ERROR: AddressSanitizer" "$work/err$n.txt")
    leaked=$(grep -oE "SUMMARY: AddressSanitizer: [0-9]+ byte\(s\) leaked in [0-9]+" "$work/err$n.txt" | grep -oE "[0-9]+ byte.*")
    grep -q "lifecycle_loop: $n iterations" "$work/out$n.txt" || verdict=FAIL
    [ "$rc" -eq 0 ] && [ "$errors" -eq 0 ] && [ -z "$leaked" ] || verdict=FAIL
    summary="$summary $n iterations: rc=$rc, $errors ASan errors, leaked ${leaked:-0 bytes}, $(( $(date +%s) - t0 )) s;"
done
grep -m3 -A12 "ERROR: AddressSanitizer\|Direct leak" "$work"/err*.txt | head -40
echo "lifecycle_asan: $verdict (libllama and ggml instrumented)$summary"
[ "$verdict" = PASS ]
