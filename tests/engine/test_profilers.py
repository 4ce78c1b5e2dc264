"""GGML_SCHED_PROFILE and GGML_CPU_OP_PROFILE (the reference's environment variables): printed at exit."""
from __future__ import annotations

import os
import re
import subprocess
import sys


def test_the_profiles_print_at_exit(lib, tiny_model_path) -> None:
    code = ("from llama_moe import *\n"
            f"with Model({str(tiny_model_path)!r}, ModelParams(cpu_moe=True, repack=False)) as m, "
            "Context(m, ContextParams(n_ctx=256, moe_cache_mib=2, moe_cache_device='CPU')) as c:\n"
            "    list(c.generate('The ship left', 12, stop_at_eog=False))\n")
    env = {**os.environ, "GGML_SCHED_PROFILE": "1", "GGML_CPU_OP_PROFILE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shapes = re.findall(r"ggml_sched_profile: +(\d+) splits +(\d+) nodes: +(\d+) graphs, +[\d.]+ ms each: CPU compute", proc.stderr)
    assert shapes and sum(int(g) for _, _, g in shapes) >= 12  # a graph per decode at least
    ops = dict(re.findall(r"ggml_cpu_op_profile: (\w+) +(\d+) ops", proc.stderr))
    assert int(ops["MUL_MAT_ID"]) > 0 and int(ops["MUL_MAT"]) > 0
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ggml_sched_profile" not in quiet.stderr and "ggml_cpu_op_profile" not in quiet.stderr
