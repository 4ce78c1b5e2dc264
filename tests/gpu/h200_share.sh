#!/usr/bin/env bash
# One call on a fresh H200 (about 8.5 min): the CUDA build in which the mailbox and the context share the
# cores (half each), then on the Qwen3-30B-A3B shape the hybrid with and without the mailbox at 25/50/75% in
# one process (a context without the mailbox between two with it), the mailbox with 4 and 12 threads, and
# where the time goes with it.
set -u
. tests/gpu/h200_setup.sh
T0=$(date +%s); left() { local s=$(( ${1} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
[ -f /tmp/q30.gguf ] || (setsid nohup nice python3 -m llama_moe synth /tmp/q30.gguf --shape qwen3-30b-a3b --experts q4_0 --quiet > /tmp/synth.log 2>&1 &)
python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real 2>&1 | tail -1
echo "cuda build: $(( $(date +%s) - T0 )) s"
while pgrep -f "llama_moe synth" > /dev/null; do sleep 2; done
t0=$(date +%s)
# the hybrids' profile from a third of each topic's train paragraphs (the whole train text takes 130 s here)
[ -f /tmp/q30.strp ] || timeout 120 python3 -c "
from pathlib import Path
from llama_moe.experts import expert_layout
from llama_moe.profile import write_profile
from llama_moe.synth.corpus import split_paragraphs
from llama_moe.tools.ranking import make_profile
from llama_moe.tools.routes import routes_from_records
from llama_moe.tools.tracing import trace_text
split = split_paragraphs()
text = '\n\n'.join(p for topic in sorted(split.train) for p in split.train[topic][::3])
write_profile(Path('/tmp/q30.strp'), make_profile(routes_from_records(trace_text(Path('/tmp/q30.gguf'), text)), expert_layout(Path('/tmp/q30.gguf'))))"
echo "profile: $(( $(date +%s) - t0 )) s"
b() { python3 -m llama_moe -v bench /tmp/q30.gguf -t 16 --no-vram --profile /tmp/q30.strp "$@"; }
timeout $(left 400) bash -c "$(declare -f b); b --runs 2 -n 128 --cache-pct 25 50 75 --modes hybrid,hybrid-no-mailbox \
    --json $OUT/bench_share.json --md $OUT/bench_share.md" > $OUT/bench_share.log 2>&1
grep -E "mailbox:|hybrid.* cache .* MiB" $OUT/bench_share.log | tail -15
for m in 4 12; do
  LLAMA_MOE_MAILBOX_THREADS=$m timeout $(left $(( m == 4 ? 440 : 475 ))) bash -c "$(declare -f b); b --runs 2 -n 128 --cache-pct 50 --modes hybrid" 2>&1 \
      | grep -E "mailbox:|hybrid.* cache .* MiB" | tail -4
done
GGML_SCHED_PROFILE=1 timeout $(left 498) bash -c "$(declare -f b); b --runs 1 -n 64 --cache-pct 50 --modes hybrid" 2>&1 \
    | grep -E "ggml_sched_profile|mailbox:|hybrid.* cache" | tee $OUT/sched_profile_share.txt
echo "total: $(( $(date +%s) - T0 )) s"
