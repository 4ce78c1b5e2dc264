#!/usr/bin/env bash
# Every mode on the Qwen3-30B-A3B shape with the recalibrated routing (recency head, depth profile), in two
# calls on one H200 (the second while the machine is warm: the build, the model and its profile stay in /tmp).
#   PART=1: the CUDA build, the model (beside the build), the profile, then at 50% the hybrid (mailbox),
#           --cpu-moe and all in VRAM.
#   PART=2: at 50% upload, the adaptive hybrid, the hybrid without the mailbox and the --n-cpu-moe split of the
#           same VRAM; the hybrid and upload at 25% and 75%; then, in the time left, equivalence on the tiny
#           models (every mode against no cache).
# Each bench step writes /tmp/NAME.{log,json,md}; everything under /tmp/*.md and *.json goes to $OUT.
set -u
. tests/gpu/h200_fresh.sh
RUNS=${RUNS:-8}
if [ "${PART:-1}" = 1 ]; then
  q30_synth
  cuda_build
  q30_profile
  q30_bench r50a $RUNS 50 hybrid,cpu-moe,vram
else
  cuda_build
  q30_bench r50b $RUNS 50 upload,hybrid-adaptive,hybrid-no-mailbox,n-cpu-moe
  q30_bench r2575 $RUNS "25 75" hybrid,upload
  for s in tiny gpt-oss-tiny; do
    f=/tmp/equivalence_$s.md
    timeout $(( $(left 590) / 2 )) python3 tests/gpu/cuda_equivalence.py --shape $s --experts q8_0 -n 128 --no-prompt 2>&1 \
        | grep -E "^'|EQUIVALENT|DIFFERENT|Error" > $f
    echo "$s: $(grep -c -- '-> ok' $f) ok, $(grep -c WRONG $f) wrong; $(tail -1 $f)"; grep WRONG $f | head -3
  done
fi
cp /tmp/*.md /tmp/*.json "$OUT"/ 2>/dev/null
echo "total: $(( $(date +%s) - T0 )) s"
