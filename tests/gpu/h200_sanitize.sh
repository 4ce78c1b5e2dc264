#!/usr/bin/env bash
# One call on a fresh H200 (about 6 min), the 2026-11-30 run: the build with the fused mailbox kernels and the
# device's step counts, then the lifecycle loop under compute-sanitizer memcheck (every cache mode, the hybrid
# through the mailbox; tests/gpu/lifecycle_cuda.sh).
set -u
. tests/gpu/h200_fresh.sh
cuda_build
timeout $(left 560) env ITERATIONS=1 bash tests/gpu/lifecycle_cuda.sh 2>&1 | tail -8
echo "total: $(( $(date +%s) - T0 )) s"
