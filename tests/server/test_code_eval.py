"""``python -m llama_moe code-eval``: every task's asserts hold for a right answer and catch wrong ones, the
runner contains bad answers (errors, loops, no code), and the whole loop runs against a real llama-server."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llama_moe.tools.server.code_eval import SUITES, extract_code, run_answer
from support.llama_server import find_server_binary, free_port, start_server, stop_server

RIGHT = {
    "is_prime": "def is_prime(n):\n    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
    "reverse_words": "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
    "fib": "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())\n",
    "flatten": "def flatten(xs):\n    out = []\n    for x in xs:\n        out += flatten(x) if isinstance(x, list) else [x]\n    return out\n",
    "fizzbuzz": "def fizzbuzz(n):\n    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i)"
                " for i in range(1, n + 1)]\n",
    "roman": "V = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'), (40, 'XL'), (10, 'X'),"
             " (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
             "def int_to_roman(n):\n    out = ''\n    for v, s in V:\n        while n >= v:\n            out += s\n            n -= v\n"
             "    return out\n"
             "def roman_to_int(s):\n    d = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\n"
             "    return sum(-d[a] if i + 1 < len(s) and d[a] < d[s[i + 1]] else d[a] for i, a in enumerate(s))\n",
    "merge_intervals": "def merge_intervals(xs):\n    out = []\n    for a, b in sorted(xs):\n"
                       "        if out and a <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], b)\n"
                       "        else:\n            out.append([a, b])\n    return out\n",
    "eval_expr": "def eval_expr(s):\n    t = s.replace(' ', '')\n    i = 0\n"
                 "    def expr():\n        nonlocal i\n        v = term()\n        while i < len(t) and t[i] in '+-':\n"
                 "            op = t[i]; i += 1; w = term(); v = v + w if op == '+' else v - w\n        return v\n"
                 "    def term():\n        nonlocal i\n        v = unary()\n        while i < len(t) and t[i] in '*/':\n"
                 "            op = t[i]; i += 1; w = unary()\n"
                 "            v = v * w if op == '*' else (abs(v) // abs(w)) * (1 if (v >= 0) == (w >= 0) else -1)\n"
                 "        return v\n"
                 "    def unary():\n        nonlocal i\n        if t[i] == '-':\n            i += 1\n            return -unary()\n"
                 "        if t[i] == '(':\n            i += 1; v = expr(); i += 1\n            return v\n"
                 "        j = i\n        while i < len(t) and t[i].isdigit():\n            i += 1\n        return int(t[j:i])\n"
                 "    return expr()\n",
    "lru_cache": "from collections import OrderedDict\nclass LRUCache:\n    def __init__(self, capacity):\n"
                 "        self.c, self.d = capacity, OrderedDict()\n    def get(self, k):\n        if k not in self.d:\n"
                 "            return -1\n        self.d.move_to_end(k)\n        return self.d[k]\n    def put(self, k, v):\n"
                 "        self.d[k] = v\n        self.d.move_to_end(k)\n        if len(self.d) > self.c:\n"
                 "            self.d.popitem(last=False)\n",
    "topo_sort": "def topo_sort(n, edges):\n    ins = [0] * n\n    out = [[] for _ in range(n)]\n    for a, b in edges:\n"
                 "        out[a].append(b); ins[b] += 1\n    q = [v for v in range(n) if ins[v] == 0]\n    order = []\n"
                 "    while q:\n        v = q.pop()\n        order.append(v)\n        for w in out[v]:\n            ins[w] -= 1\n"
                 "            if ins[w] == 0:\n                q.append(w)\n    return order if len(order) == n else None\n",
    "lcs": "def lcs(a, b):\n    prev = [0] * (len(b) + 1)\n    for x in a:\n        cur = [0]\n        for j, y in enumerate(b):\n"
           "            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))\n        prev = cur\n    return prev[-1]\n",
    "dijkstra": "import heapq\ndef dijkstra(n, edges, src):\n    g = [[] for _ in range(n)]\n    for a, b, w in edges:\n"
                "        g[a].append((b, w))\n    d = [float('inf')] * n\n    d[src] = 0\n    h = [(0, src)]\n    while h:\n"
                "        du, u = heapq.heappop(h)\n        if du > d[u]:\n            continue\n        for v, w in g[u]:\n"
                "            if du + w < d[v]:\n                d[v] = du + w\n                heapq.heappush(h, (d[v], v))\n"
                "    return d\n",
    "rle": "import itertools, re\ndef rle_encode(s):\n    return ''.join(k + str(len(list(g))) for k, g in itertools.groupby(s))\n"
           "def rle_decode(s):\n    return ''.join(c * int(n) for c, n in re.findall(r'(\\D)(\\d+)', s))\n",
    "balanced": "def balanced(s):\n    st = []\n    pairs = {')': '(', ']': '[', '}': '{'}\n    for c in s:\n"
                "        if c in '([{':\n            st.append(c)\n        elif c in pairs:\n"
                "            if not st or st.pop() != pairs[c]:\n                return False\n    return not st\n",
    "spiral": "def spiral(m):\n    out = []\n    m = [row[:] for row in m]\n    while m:\n        out += m.pop(0)\n"
              "        m = [list(r) for r in zip(*m)][::-1]\n    return out\n",
}


@pytest.mark.parametrize("task", [t for suite in SUITES.values() for t in suite], ids=lambda t: t.name)
def test_every_task_passes_a_right_answer_and_fails_a_wrong_one(task) -> None:
    assert run_answer(RIGHT[task.name], task.checks) == (True, "ok")
    # the same answer with its last return broken: the asserts notice
    head, _, tail = RIGHT[task.name].rpartition("return ")
    wrong = head + "return None and " + tail
    passed, detail = run_answer(wrong, task.checks)
    assert not passed and detail


def test_suites_have_the_reference_sizes() -> None:
    assert len(SUITES["smoke"]) == 6 and len(SUITES["hard"]) == 10
    assert len({t.name for s in SUITES.values() for t in s}) == 16


def test_bad_answers_fail_with_a_reason() -> None:
    assert run_answer("", "assert True") == (False, "no code in the answer")
    passed, detail = run_answer("def f(:\n", "f()")
    assert not passed and "SyntaxError" in detail
    passed, detail = run_answer("while True:\n    pass\n", "", timeout=1)
    assert (passed, detail) == (False, "over the 1 s limit")
    passed, detail = run_answer("x = bytearray(8 << 30)\n", "")
    assert not passed and "MemoryError" in detail


def test_code_is_taken_from_the_first_block() -> None:
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nThat is all.") == "def f():\n    return 1\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("def g(): pass") == "def g(): pass\n"
    assert extract_code("```python\ndef h():\n    return") == "def h():\n    return"  # cut by max_tokens


def test_the_loop_runs_against_a_real_server(lib, tiny_model_path, tmp_path) -> None:
    binary = find_server_binary()
    proc, url = start_server(binary, ["-m", str(tiny_model_path), "-c", "1024"], tmp_path / "server.log")
    try:
        port = url.rsplit(":", 1)[1]
        out = subprocess.run([sys.executable, "-m", "llama_moe", "code-eval", str(tiny_model_path), "--no-server", "--port",
                              port, "--max-tokens", "24", "--json"], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout)
        assert [r["name"] for r in result["results"]] == [t.name for t in SUITES["smoke"]]
        # a synthetic model writes no working code: each task fails with its reason, none crashes the loop
        assert all(r["detail"] for r in result["results"]) and result["n_passed"] == 0
        strict = subprocess.run([sys.executable, "-m", "llama_moe", "code-eval", str(tiny_model_path), "--no-server",
                                 "--port", port, "--max-tokens", "8", "--min-pass", "1"], capture_output=True, text=True,
                                timeout=600)
        assert strict.returncode == 1 and "0 of 6 tasks passed" in strict.stdout
    finally:
        stop_server(proc)


def test_it_serves_the_model_itself(lib, tiny_model_path) -> None:
    find_server_binary()
    out = subprocess.run([sys.executable, "-m", "llama_moe", "code-eval", str(tiny_model_path), "--port", str(free_port()),
                          "--max-tokens", "8", "--ctx", "1024"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "0 of 6 tasks passed" in out.stdout and "serving at http://127.0.0.1:" in out.stderr


def test_no_server_listening_is_a_clear_error(lib, tiny_model_path) -> None:
    out = subprocess.run([sys.executable, "-m", "llama_moe", "code-eval", str(tiny_model_path), "--no-server", "--port",
                          str(free_port())], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "error: http://127.0.0.1:" in out.stderr and "Traceback" not in out.stderr
