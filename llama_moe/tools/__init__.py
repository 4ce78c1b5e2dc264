"""The tools over the binding: synthetic models (synth), routing traces, profiles and plans (routing), the
benchmarks (bench), llama-server and the installation checks (server), and ``python -m llama_moe`` (cli).

They build on ``llama_moe`` (the binding); the binding never imports them (tests/test_import_rules.py)."""
