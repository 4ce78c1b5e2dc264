"""The benchmark runs every mode side by side (tiny model, the CPU as the cache device): a smoke test of the
harness, not of speed (speed is measured on the GPU and quoted in docs/benchmarks.md)."""
from __future__ import annotations

import pytest

from llama_moe.tools.bench.throughput import MODES, run_bench, to_markdown, train_profile


def test_every_mode_runs_and_reports(lib, tiny_model_path, tmp_path) -> None:
    profile = train_profile(tiny_model_path, tmp_path / "train.strp", log=lambda s: None)
    rows = run_bench(tiny_model_path, [50], [2], n_gen=24, n_pp=64, runs=1, vram=True, log=lambda s: None,
                     modes=MODES, profile=profile, cache_device="CPU")
    assert [r.mode for r in rows] == ["cpu-moe", "upload", "hybrid", "hybrid-no-mailbox", "hybrid-adaptive", "hybrid-admit",
                                      "n-cpu-moe 3", "all-in-vram"]
    assert all(r.decode_tps > 0 and r.pp_tps > 0 for r in rows)
    cached = [r for r in rows if r.mode in ("upload", "hybrid", "hybrid-no-mailbox", "hybrid-adaptive", "hybrid-admit")]
    assert all(r.hit_rate is not None and 0 < r.hit_rate <= 1 and not r.cache_off for r in cached)
    assert all(abs(r.cache_pct - 50) < 1 for r in cached)
    # the RAM bound: every expert of a token from RAM for cpu-moe, the CPU's share for the hybrid, none in VRAM
    by_mode = {r.mode: r for r in rows}
    # without a GPU there is no mailbox: the same hand-overs, so the same routing, hits and bytes from RAM
    assert by_mode["hybrid-no-mailbox"].hit_rate == by_mode["hybrid"].hit_rate
    assert by_mode["hybrid-no-mailbox"].ram_mb_per_token == by_mode["hybrid"].ram_mb_per_token
    assert by_mode["cpu-moe"].ram_mb_per_token > by_mode["hybrid"].ram_mb_per_token > 0
    assert by_mode["all-in-vram"].bound_tps is None and by_mode["upload"].ram_mb_per_token is None
    assert 0 < by_mode["cpu-moe"].of_bound == pytest.approx(by_mode["cpu-moe"].decode_tps / by_mode["cpu-moe"].bound_tps)
    table = to_markdown(rows, 64)
    assert table.count("\n") == len(rows) + 1 and "pp64" in table


def test_cache_modes_without_a_cache_are_marked(lib, tiny_model_path) -> None:
    """No GPU and no cache device named: the engine turns the cache off, and the rows say so instead of
    passing cpu-moe's numbers off as the cache's."""
    from llama_moe.devices import gpus

    if gpus():
        pytest.skip("a GPU holds the cache here")   # the CI machine has none; this case is about it
    said: list[str] = []
    rows = run_bench(tiny_model_path, [50], [2], n_gen=8, n_pp=32, runs=1, vram=False, log=said.append,
                     modes=("cpu-moe", "upload"))
    cpu, upload = rows
    assert not cpu.cache_off and upload.cache_off and upload.hit_rate is None
    assert upload.ram_mb_per_token == cpu.ram_mb_per_token   # every expert from RAM, as it ran
    assert any("upload: the context has no MoE cache" in s for s in said)
    assert "| upload (cache off: no GPU) |" in to_markdown(rows, 32)


def test_profile_stride_traces_fewer_paragraphs(lib, tiny_model_path, tmp_path) -> None:
    from llama_moe.formats.profile import read_profile

    logs: list[str] = []
    train_profile(tiny_model_path, tmp_path / "all.strp", log=logs.append, n_ctx=512)
    train_profile(tiny_model_path, tmp_path / "third.strp", log=logs.append, n_ctx=512, stride=3)
    chars = [int(line.split()[2]) for line in logs]
    assert 2 * chars[1] < chars[0]
    assert read_profile(tmp_path / "third.strp", 6, 32).ranked
    with pytest.raises(ValueError, match="stride"):
        train_profile(tiny_model_path, tmp_path / "x.strp", stride=0)


def test_the_gpu_bounds_every_mode_where_it_binds_first() -> None:
    from llama_moe.tools.bench.throughput import BenchRow, with_gpu_ceiling

    def row(mode: str, decode: float, bound: float | None, by: str | None) -> BenchRow:
        return BenchRow(mode, 0.0, 0.0, 16, decode, 0.0, 1.0, 0.0, None, None, 1, 1.0, bound,
                        None if bound is None else decode / bound, by)

    hybrid = with_gpu_ceiling(row("hybrid", 97.4, 1152.7, "RAM"), 232.6)
    assert (hybrid.bound_tps, hybrid.bound_by) == (232.6, "GPU") and hybrid.of_bound == pytest.approx(97.4 / 232.6)
    cpu = row("cpu-moe", 41.9, 49.2, "RAM")
    assert with_gpu_ceiling(cpu, 232.6) == cpu
    vram = row("all-in-vram", 232.6, None, None)
    assert with_gpu_ceiling(vram, 232.6) == vram


def test_merge_joins_runs_under_one_ceiling_and_refuses_what_it_cannot(tmp_path, capsys) -> None:
    """Runs split over several calls (a big model on a machine lent 10 minutes a call) become one table; the
    all-in-VRAM row of one bounds the rows of the others."""
    import dataclasses
    import json

    from llama_moe.tools.cli import main
    from llama_moe.tools.bench.throughput import BenchRow

    def row(mode: str, decode: float, bound: float | None, by: str | None) -> BenchRow:
        return BenchRow(mode, 100.0, 50.0, 16, decode, 1.0, 900.0, 5.0, 0.9, 2000.0, 2, 10.0, bound,
                        None if bound is None else decode / bound, by)

    baselines = [row("cpu-moe", 20.0, 30.0, "RAM"), row("all-in-vram", 150.0, None, None)]
    cached = [row("hybrid", 90.0, 900.0, "RAM"), row("upload", 80.0, 60.0, "H2D")]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([dataclasses.asdict(r) for r in baselines]))
    b.write_text(json.dumps([dataclasses.asdict(r) for r in cached]))
    out = tmp_path / "all.json"
    assert main(["bench", "--merge", str(a), str(b), "--json", str(out), "--md", str(tmp_path / "all.md")]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())}
    assert list(rows) == ["cpu-moe", "all-in-vram", "hybrid", "upload"]
    assert (rows["hybrid"]["bound_tps"], rows["hybrid"]["bound_by"]) == (150.0, "GPU")
    assert rows["hybrid"]["of_bound"] == pytest.approx(0.6)
    assert (rows["upload"]["bound_tps"], rows["upload"]["bound_by"]) == (60.0, "H2D")  # PCIe binds first
    assert "| hybrid | 100 | 50 | 16 | 90.00 (1.00) |" in (tmp_path / "all.md").read_text()
    capsys.readouterr()

    two_ceilings = tmp_path / "c.json"
    two_ceilings.write_text(json.dumps([dataclasses.asdict(baselines[1])]))
    broken = tmp_path / "broken.json"
    broken.write_text('[{"mode": "hybrid"}]')
    for argv, message in ((["--merge", str(a), str(two_ceilings)], "2 all-in-VRAM rows"),
                          (["--merge", str(broken)], "row 0 lacks cache_mib"),
                          (["--merge", str(tmp_path / "none.json")], "not a JSON file"),
                          (["model.gguf", "--merge", str(a)], "runs nothing"),
                          ([], "needs a model")):
        assert main(["bench", *argv]) != 0
        assert message in capsys.readouterr().err
