# Sourced by the one-call scripts for a fresh H200 machine: the setup, a clock (left N: the seconds until N
# seconds after the start), the Qwen3-30B-A3B-shaped model synthesized beside the CUDA build, and the hybrids'
# profile from a third of each topic's train paragraphs (the whole train text takes 130 s there).
. tests/gpu/h200_setup.sh
T0=$(date +%s); left() { local s=$(( ${1} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
[ -f /tmp/q30.gguf ] || (setsid nohup nice python3 -m llama_moe synth /tmp/q30.gguf --shape qwen3-30b-a3b --experts q4_0 --quiet > /tmp/synth.log 2>&1 &)
python3 build_native.py --source .bundle/llama.cpp-0c1e57098.tar.xz --cuda --cuda-arch 90-real 2>&1 | tail -1
echo "cuda build: $(( $(date +%s) - T0 )) s"
while pgrep -f "llama_moe synth" > /dev/null; do sleep 2; done
t0=$(date +%s)
[ -f /tmp/q30.strp ] || timeout 120 python3 -c "
from pathlib import Path
from llama_moe.commands.bench import train_profile
train_profile(Path('/tmp/q30.gguf'), Path('/tmp/q30.strp'), stride=3)"
echo "profile: $(( $(date +%s) - t0 )) s"
