# Sourced by the H200 scripts: the wheels the machine lacks, the system compiler (the machine's default CXX,
# /opt/gcc, links libstdc++ statically, which llama_moe refuses to load next to numpy), and a cache folder in
# /tmp, which survives between two calls on the same machine (ignored folders of the checkout do not).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export LLAMA_MOE_CACHE_DIR=/tmp/lmcache CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
mkdir -p "${OUT:-/tmp/out}"
