"""The benchmark's decode rates as a PNG: tok/s against the cache size, one line per mode (and per thread count).

matplotlib is optional (``pip install 'llama_moe[bench]'``) and imported only when a plot is drawn; the figure is
drawn on the Agg canvas, never through pyplot, so no display or global backend is touched."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ...formats.atomic import atomic_writer
from ..errors import PlotUnavailableError
from .throughput import BenchRow

INSTALL_HINT = "pip install 'llama_moe[bench]'"

# modes drawn as lines over the cache size, in the order bench.MODES runs them; others follow in the rows' order
_LINE_ORDER = ("n-cpu-moe", "upload", "hybrid", "hybrid-no-mailbox", "hybrid-adaptive", "hybrid-admit")
_LABELS = {
    "n-cpu-moe": "n-cpu-moe N (llama.cpp's split)",
    "cpu-moe": "cpu-moe (experts in RAM)",
    "all-in-vram": "all in VRAM",
}


def _matplotlib():
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailableError(f"the PNG plot needs matplotlib: {INSTALL_HINT} ({exc})") from None
    return matplotlib, Figure, FigureCanvasAgg


def require_matplotlib() -> None:
    """Raises PlotUnavailableError when matplotlib is missing: checked before any measurement."""
    _matplotlib()


def _family(mode: str) -> str:
    """'n-cpu-moe 37' is llama.cpp's plain split with 37 layers' experts in RAM: one mode at several sizes."""
    return "n-cpu-moe" if mode.startswith("n-cpu-moe") else mode


def _is_reference(family: str, rows: list[BenchRow]) -> bool:
    """Modes without a cache to vary: experts all in RAM, or the whole model in VRAM."""
    return family in ("cpu-moe", "all-in-vram") or all(r.cache_mib == 0 for r in rows)


def plot_decode(rows: Iterable[BenchRow], path: Path, *, title: str | None = None) -> Path:
    """Write decode tok/s against the cache size (in % of the experts) as a PNG at ``path``.

    Each mode with a cache is a line (one per thread count when several were run) whose error bars span the
    runs' spread (max - min, centred on the median); cpu-moe and all-in-VRAM are horizontal reference lines with
    their spread as a band. Raises PlotUnavailableError when matplotlib is missing."""
    fig = decode_figure(rows, title=title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # no Software tag: the same rows give the same bytes whatever matplotlib wrote them; whole or not at all
    with atomic_writer(path, "wb") as f:
        fig.savefig(f, format="png", bbox_inches="tight", metadata={"Software": None})
    return path


def decode_figure(rows: Iterable[BenchRow], *, title: str | None = None):
    """plot_decode's figure (a matplotlib Figure on the Agg canvas), not yet saved."""
    rows = list(rows)
    if not rows:
        raise ValueError("no benchmark rows to plot")
    matplotlib, Figure, FigureCanvasAgg = _matplotlib()

    groups: dict[tuple[str, int], list[BenchRow]] = {}
    for r in rows:
        groups.setdefault((_family(r.mode), r.threads), []).append(r)
    thread_counts = sorted({r.threads for r in rows})
    several_threads = len(thread_counts) > 1
    families = list(dict.fromkeys(_family(r.mode) for r in rows))
    by_family = {f: [r for r in rows if _family(r.mode) == f] for f in families}
    references = [f for f in families if _is_reference(f, by_family[f])]
    lines = sorted((f for f in families if f not in references),
                   key=lambda f: (_LINE_ORDER.index(f) if f in _LINE_ORDER else len(_LINE_ORDER), families.index(f)))

    palette = matplotlib.rcParams["axes.prop_cycle"].by_key().get("color") or ["C0"]
    colors = {f: palette[i % len(palette)] for i, f in enumerate(lines + references)}
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v"]

    fig = Figure(figsize=(9, 5.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)

    handles = []
    annotated: set[str] = set()

    def label(family: str, threads: int) -> str:
        name = _LABELS.get(family, family)
        return f"{name}, {threads} threads" if several_threads else name

    for family in lines:
        for ti, t in enumerate(thread_counts):
            pts = sorted(groups.get((family, t), []), key=lambda r: r.cache_pct)
            if not pts:
                continue
            handles.append(ax.errorbar(
                [r.cache_pct for r in pts], [r.decode_tps for r in pts], yerr=[r.decode_tps_spread / 2 for r in pts],
                color=colors[family], linestyle=styles[ti % len(styles)], marker=markers[ti % len(markers)],
                markersize=5, capsize=3, linewidth=1.6, label=label(family, t)))
            if family == "n-cpu-moe" and family not in annotated:  # which split each point is (once)
                annotated.add(family)
                for r in pts:
                    ax.annotate(f"N={r.mode.split()[-1]}", (r.cache_pct, r.decode_tps), textcoords="offset points",
                                xytext=(4, -12), fontsize=7, color=colors[family])

    for family in references:
        for ti, t in enumerate(thread_counts):
            pts = groups.get((family, t), [])
            if not pts:
                continue
            mid = sorted(pts, key=lambda r: r.decode_tps)[len(pts) // 2]
            tps, spread = mid.decode_tps, mid.decode_tps_spread
            handles.append(ax.axhline(tps, color=colors[family], linestyle=styles[ti % len(styles)], linewidth=1.3,
                                      label=label(family, t)))
            if spread > 0:
                ax.axhspan(tps - spread / 2, tps + spread / 2, color=colors[family], alpha=0.12, linewidth=0)

    ax.set_xlim(-2, 102)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("VRAM for experts (cache size, % of all expert bytes)")
    ax.set_ylabel("decode tok/s (median; bars: spread over runs)")
    if title is None:
        title = "Decode throughput against expert cache size"
        if not several_threads:
            title += f" ({thread_counts[0]} threads)"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    # in drawing order: the cached modes, then the baselines drawn as lines (matplotlib would put plain lines first)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
