#!/usr/bin/env bash
# On a fresh machine (FRESH=1: builds, synthesizes and profiles first, 6 min) or after h200_build.sh and
# h200_bench.sh on the same one (the build, /tmp/q30.gguf and /tmp/q30.strp): the
# mailbox's CPU part under OpenMP's spinning policies and thread counts, each in a fresh process (libgomp reads
# its environment once), the hybrid at 50%, then the scheduler's hybrid for reference. About 4 minutes.
set -u
if [ -n "${FRESH:-}" ]; then . tests/gpu/h200_fresh.sh; q30_synth; cuda_build; q30_profile; else . tests/gpu/h200_setup.sh; fi
b() { timeout 80 python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs 2 -n 96 --cache-pct 50 --no-vram --profile /tmp/q30.strp "$@" 2>&1 \
      | grep -E "hand-overs from the GPU|hybrid.* cache .* MiB" | sed -E 's/^ +//'; }
for v in "" "GOMP_SPINCOUNT=100000000" "OMP_WAIT_POLICY=active" "OMP_WAIT_POLICY=passive" "LLAMA_MOE_MAILBOX_THREADS=8" \
         "LLAMA_MOE_MAILBOX_THREADS=1"; do
  echo "== mailbox ${v:-defaults}"; env $v bash -c "$(declare -f b); b --modes hybrid"
done
echo "== through the scheduler"; b --modes hybrid-no-mailbox
