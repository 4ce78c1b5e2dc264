# Sourced by run.sh and the scripts beside it on a lent GPU machine: the wheels the machine lacks (.whl), the
# system compiler (the image's default CXX links libstdc++ statically, which llama_moe refuses to load next to
# numpy), a build cache in /tmp (it survives between two calls on the same machine; ignored folders of the
# checkout do not), and a clock: `left N` is the seconds until N seconds after T0, at least 1.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export LLAMA_MOE_CACHE_DIR=/tmp/lmcache CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
mkdir -p "${OUT:-/tmp/out}"
T0=${T0:-$(date +%s)}
left() { local s=$(( ${1} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
