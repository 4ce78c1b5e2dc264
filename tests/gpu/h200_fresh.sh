# Sourced by the H200 scripts that start on a fresh machine: the setup, a clock (left N: the seconds until N
# seconds after the start, at least 1), and the steps they call in their own order: q30_synth (the
# Qwen3-30B-A3B-shaped model, in the background, beside the build), cuda_build, q30_profile (waits for the
# model, then the hybrids' profile from a third of each topic's train paragraphs; the whole text takes 130 s),
# equivalence SHAPE EXPERTS DIR (cuda_equivalence.py on a tiny model of that shape, its lines kept in
# DIR/equivalence_SHAPE.md, a summary printed), and q30_bench NAME RUNS PCTS MODES [VAR=VALUE...] (bench on the
# q30 model with its profile, until 585 s after the start; /tmp/NAME.{log,json,md}, the mailbox's lines and the
# table's rows printed).
. tests/gpu/h200_setup.sh
T0=$(date +%s); left() { local s=$(( ${1} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
q30_synth() {
  if ! pgrep -f "llama_moe synth" > /dev/null && [ ! -f /tmp/q30.gguf ]; then
    (setsid nohup nice python3 -m llama_moe synth /tmp/q30.gguf --shape qwen3-30b-a3b --experts q4_0 --quiet > /tmp/synth.log 2>&1 &)
  fi
}
cuda_build() {
  python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real "$@" 2>&1 | tail -2
  echo "cuda build: $(( $(date +%s) - T0 )) s after the start"
}
q30_profile() {
  while pgrep -f "llama_moe synth" > /dev/null; do sleep 2; done
  local t0=$(date +%s)
  [ -f /tmp/q30.strp ] || timeout 120 python3 -c "
from pathlib import Path
from llama_moe.bench.corpus_profile import train_profile
train_profile(Path('/tmp/q30.gguf'), Path('/tmp/q30.strp'), stride=3)"
  echo "profile: $(( $(date +%s) - t0 )) s"
}
equivalence() {
  local f=$3/equivalence_$1.md
  timeout 90 python3 tests/gpu/cuda_equivalence.py --shape $1 --experts $2 -n 128 --no-prompt 2>&1 \
      | grep -E "^'|EQUIVALENT|DIFFERENT|Error" > $f
  echo "$1: $(grep -c -- '-> ok' $f) ok, $(grep -c WRONG $f) wrong; $(tail -1 $f)"
}
q30_bench() {
  local name=$1 runs=$2 pcts=$3 modes=$4; shift 4
  env "$@" timeout $(left 585) python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --runs $runs -n 128 --cache-pct $pcts \
      --modes $modes --profile /tmp/q30.strp --json /tmp/$name.json --md /tmp/$name.md > /tmp/$name.log 2>&1
  echo "== $name ($*): $(( $(date +%s) - T0 )) s"
  grep -E "RAM read|host to device|mailbox: " /tmp/$name.log | sed -E 's/^ +//' | cut -c1-400
  grep -E "^\| (hybrid|all|upload)" /tmp/$name.md
}
