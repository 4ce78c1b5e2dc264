#!/usr/bin/env bash
# One call on a fresh H200 (about 9.5 min), sixth session (issue 9): the fused mailbox kernels plus the device's
# own step counts, checked against the scheduler bit for bit on the tiny model, then the hybrid at 50% against
# the scheduler's and all in VRAM over 15 runs each, the old kernels (LLAMA_MOE_MAILBOX_FUSE=0) over 15, the
# hand-over alone (LLAMA_MOE_MAILBOX_TEST_EMPTY=1), and 25% and 75% beside upload mode.
set -u
. tests/gpu/h200_fresh.sh
q30_synth
cuda_build
equivalence tiny q8_0 /tmp
q30_profile
b() { # name, runs, pcts, modes, env...
  local name=$1 runs=$2 pcts=$3 modes=$4; shift 4
  env "$@" timeout $(left 590) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs $runs -n 128 --cache-pct $pcts \
      --modes $modes --profile /tmp/q30.strp --json /tmp/$name.json --md /tmp/$name.md > /tmp/$name.log 2>&1
  echo "== $name ($*): $(( $(date +%s) - T0 )) s"
  grep -E "RAM read|host to device|mailbox: the CPU|mailbox: a part" /tmp/$name.log | sed -E 's/^ +//'
  grep -E "^\| (hybrid|all|upload)" /tmp/$name.md
}
b fused 15 50 hybrid,hybrid-no-mailbox,vram
b unfused 15 50 hybrid LLAMA_MOE_MAILBOX_FUSE=0
b empty 5 50 hybrid LLAMA_MOE_MAILBOX_TEST_EMPTY=1
b sizes 3 "25 75" upload,hybrid,hybrid-no-mailbox
tar czf $OUT/runs.tgz /tmp/*.log /tmp/*.json /tmp/*.md 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
