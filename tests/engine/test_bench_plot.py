"""bench --png: the decode plot from hand-made rows (no benchmark is run), and the message when matplotlib is missing."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llama_moe.tools.bench.plot import decode_figure, plot_decode
from llama_moe.tools.bench.throughput import BenchRow

REPO = Path(__file__).resolve().parents[2]


def _row(mode: str, pct: float, tps: float, spread: float = 0.5, threads: int = 8) -> BenchRow:
    mib = 40.0 * pct  # 4000 MiB of experts
    return BenchRow(mode=mode, cache_mib=mib, cache_pct=pct, threads=threads, decode_tps=tps,
                    decode_tps_spread=spread, pp_tps=100.0, pp_tps_spread=1.0, hit_rate=None, vram_mib=None, runs=2)


def _rows(upload_scale: float = 1.0, threads: tuple[int, ...] = (8,)) -> list[BenchRow]:
    rows: list[BenchRow] = []
    for t in threads:
        rows.append(_row("cpu-moe", 0, 9.0, threads=t))
        for pct, n in ((25, 36), (50, 24), (75, 12)):
            rows += [_row("upload", pct, upload_scale * (5 + pct / 10), threads=t),
                     _row("hybrid", pct, 12 + pct / 5, 1.5, threads=t),
                     _row("hybrid-adaptive", pct, 13 + pct / 5, threads=t)]
        rows += [_row(f"n-cpu-moe {n}", pct - 2, 10 + pct / 8, threads=t) for pct, n in ((25, 36), (50, 24), (75, 12))]
    rows.append(_row("all-in-vram", 100, 60.0, 2.0))
    return rows


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, "the first chunk is not IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data[-12:-4] == b"\x00\x00\x00\x00IEND", "no IEND chunk at the end"
    return width, height


def test_plot_is_a_png_that_shows_the_data(tmp_path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    a, same, b = tmp_path / "a.png", tmp_path / "same.png", tmp_path / "sub" / "b.png"
    assert plot_decode(_rows(), a) == a
    plot_decode(_rows(), same)
    plot_decode(_rows(upload_scale=2.0), b)

    width, height = _png_size(a)
    assert 600 <= width <= 3000 and 300 <= height <= 2000, (width, height)
    pixels = image.imread(a)
    assert pixels.shape[:2] == (height, width)
    assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7]}) > 20, "hardly any colours: blank?"
    # the same rows give the same bytes, so a difference comes from the data alone
    assert a.read_bytes() == same.read_bytes()
    other = image.imread(b)
    assert other.shape != pixels.shape or (other != pixels).any(), "other decode rates drew the same image"


def test_one_line_per_mode_and_reference_lines() -> None:
    pytest.importorskip("matplotlib")
    fig = decode_figure(_rows())
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["n-cpu-moe N (llama.cpp's split)", "upload", "hybrid", "hybrid-adaptive",
                      "cpu-moe (experts in RAM)", "all in VRAM"]
    assert "8 threads" in ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    bars = {c.get_label(): c for c in ax.containers}  # errorbar lines: data line, caps, bars
    refs = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert set(bars) == {"n-cpu-moe N (llama.cpp's split)", "upload", "hybrid", "hybrid-adaptive"}
    assert set(refs) == {"cpu-moe (experts in RAM)", "all in VRAM"}
    assert list(bars["upload"].lines[0].get_xdata()) == [25, 50, 75]
    assert list(bars["upload"].lines[0].get_ydata()) == [7.5, 10, 12.5]
    # three splits, one line, in order of size
    assert list(bars["n-cpu-moe N (llama.cpp's split)"].lines[0].get_xdata()) == [23, 48, 73]
    for ref, tps in (("cpu-moe (experts in RAM)", 9.0), ("all in VRAM", 60.0)):  # horizontal across the axes
        assert list(refs[ref].get_ydata()) == [tps, tps] and list(refs[ref].get_xdata()) == [0, 1]
    # the hybrid's error bar spans its spread of 1.5 tok/s, centred on the median
    segments = bars["hybrid"].lines[2][0].get_segments()
    assert [round(s[1][1] - s[0][1], 6) for s in segments] == [1.5, 1.5, 1.5]
    assert {round((s[0][1] + s[1][1]) / 2, 6) for s in segments} == {17.0, 22.0, 27.0}


def test_several_thread_counts_are_separate_lines() -> None:
    pytest.importorskip("matplotlib")
    fig = decode_figure(_rows(threads=(4, 8)))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "upload, 4 threads" in labels and "upload, 8 threads" in labels
    assert "cpu-moe (experts in RAM), 4 threads" in labels and "all in VRAM, 8 threads" in labels
    assert len(labels) == len(set(labels)) == 11  # 5 modes x 2 thread counts, all-in-VRAM runs once


def test_no_rows_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no benchmark rows"):
        plot_decode([], tmp_path / "x.png")


BLOCKER = '''
import sys

class _NoMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoMatplotlib())
'''


def test_without_matplotlib_the_message_says_what_to_install(tmp_path: Path) -> None:
    """A fresh interpreter whose sitecustomize hides matplotlib, whether or not it is installed."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)]
                                                       + [p for p in [os.environ.get("PYTHONPATH")] if p])}

    def python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)

    # the blocker works
    probe = python("-c", "import matplotlib")
    assert probe.returncode != 0 and "No module named 'matplotlib'" in probe.stderr
    # the command refuses --png before it measures anything (the model is not even looked at)
    out = tmp_path / "plot.png"
    cli = python("-m", "llama_moe", "bench", str(tmp_path / "missing.gguf"), "--png", str(out))
    assert cli.returncode == 2, cli.stderr
    assert "--png" in cli.stderr and "pip install 'llama_moe[bench]'" in cli.stderr, cli.stderr
    assert not out.exists()
    # the function says the same, as a LlamaMoeError
    api = python("-c", textwrap.dedent(f"""
        from pathlib import Path
        from llama_moe.tools.bench.plot import plot_decode
        from llama_moe.tools.bench.throughput import BenchRow
        from llama_moe.errors import LlamaMoeError
        try:
            plot_decode([BenchRow("cpu-moe", 0, 0, 8, 9.0, 0.5, 100.0, 1.0, None, None, 2)], Path({str(out)!r}))
        except LlamaMoeError as exc:
            print("refused:", exc)
    """))
    assert api.returncode == 0, api.stderr
    assert api.stdout.startswith("refused: the PNG plot needs matplotlib: pip install 'llama_moe[bench]'"), api.stdout
    assert not out.exists()
