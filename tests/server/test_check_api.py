"""check-api on a real llama-server (127.0.0.1): the contract's form (MODEL PROFILE --cache-mib: it starts,
checks and stops its own server), and --server against servers that want a key or have no cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from llama_moe.tools.server.check_api import KEY_WANTED, check_api, serve_and_check
from support.llama_server import find_server_binary, start_server, stop_server

NAMES = ["api key", "openai chat.completions", "openai completions", "openai chat.completions stream",
         "anthropic messages", "openai with a wrong key", "anthropic with a wrong key", "moe cache"]



def test_the_contract_form_starts_checks_and_stops_a_server(lib, tiny_model_path, profile, tmp_path) -> None:
    find_server_binary()
    checks = serve_and_check(tiny_model_path, profile, cache_mib=2, workdir=tmp_path / "w", log=lambda s: None)
    assert [c.name for c in checks] == NAMES and all(c.ok for c in checks), checks
    assert "upload mode" in checks[-1].detail and "looked up" in checks[-1].detail
    log = (tmp_path / "w" / "server.log").read_text(errors="replace")
    assert "moe_cache" in log or "MoE cache" in log


def test_the_contract_form_on_the_command_line(lib, tiny_model_path, profile) -> None:
    find_server_binary()
    out = subprocess.run([sys.executable, "-m", "llama_moe", "check-api", str(tiny_model_path), str(profile),
                          "--cache-mib", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [c["name"] for c in json.loads(out.stdout)] == NAMES
    for argv, said in (([str(tiny_model_path)], "check-api MODEL needs PROFILE too"),
                       ([str(tiny_model_path), str(profile), "--server", "http://127.0.0.1:1"], "--server checks a running"),
                       (["--cache-mib", "2"], "--cache-mib sizes the cache of the server check-api MODEL PROFILE starts"),
                       ([str(tiny_model_path), str(profile), "--cache-mib", "0"], "--cache-mib must be > 0")):
        bad = subprocess.run([sys.executable, "-m", "llama_moe", "check-api", *argv], capture_output=True, text=True,
                             timeout=120)
        assert bad.returncode == 2 and said in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_a_server_that_wants_a_key(lib, tiny_model_path, tmp_path) -> None:
    binary = find_server_binary()
    proc, url = start_server(binary, ["-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--moe-cache-mib", "2",
                                      "--metrics", "--api-key", "k-123", "-c", "512", "-np", "1", "--no-warmup"],
                             tmp_path / "server.log")
    try:
        (only,) = check_api(url)   # no key: one finding that says what is wanted, not a 401 per endpoint
        assert not only.ok and only.detail == KEY_WANTED
        env = {k: v for k, v in os.environ.items() if k != "LLAMA_API_KEY"}
        cli = subprocess.run([sys.executable, "-m", "llama_moe", "check-api", "--server", url], capture_output=True,
                             text=True, timeout=300, env=env)
        assert cli.returncode == 1 and cli.stdout.strip() == f"FAIL  api key: {KEY_WANTED}", cli.stdout + cli.stderr
        cli = subprocess.run([sys.executable, "-m", "llama_moe", "check-api", "--server", url], capture_output=True,
                             text=True, timeout=300, env={**env, "LLAMA_API_KEY": "k-123"})
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert cli.stdout.count("PASS") == len(NAMES)
        assert "HTTP Request:" not in cli.stderr, cli.stderr  # the HTTP library's log of every request: -v only
        loud = subprocess.run([sys.executable, "-m", "llama_moe", "-v", "check-api", "--server", url],
                              capture_output=True, text=True, timeout=300, env={**env, "LLAMA_API_KEY": "k-123"})
        assert loud.returncode == 0 and f'HTTP Request: POST {url}/v1/chat/completions "HTTP/1.1 200 OK"' in loud.stderr
    finally:
        stop_server(proc)


def test_a_server_without_the_cache_fails_the_cache_check(lib, tiny_model_path, tmp_path) -> None:
    binary = find_server_binary()
    proc, url = start_server(binary, ["-m", str(tiny_model_path), "--metrics", "-c", "512", "-np", "1", "--no-warmup"],
                             tmp_path / "server.log")
    try:
        checks = check_api(url)
        assert [c.name for c in checks if not c.ok] == ["moe cache"], checks
        assert "no MoE cache" in checks[-1].detail
        assert all(c.ok for c in check_api(url, cache=False))
    finally:
        stop_server(proc)
