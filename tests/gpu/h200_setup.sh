# Sourced by the H200 scripts: wheels the machine lacks, and a cache dir inside the checkout so that a
# build survives between two calls on the same machine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export LLAMA_MOE_CACHE_DIR=$PWD/.lmcache
mkdir -p "${OUT:-/tmp/out}"
