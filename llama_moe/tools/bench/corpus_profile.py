"""A profile made from the embedded corpus's train paragraphs: what the benchmarks and the installation checks
fill a hybrid cache from, so that the text they decode (the held-out paragraphs) is text it was not made from."""
from __future__ import annotations

from pathlib import Path

from ...errors import ParameterError
from ..experts import expert_layout


def train_profile(model_path: Path, out: Path, log=print, n_ctx: int = 4096, stride: int = 1) -> Path:
    """A profile from the corpus's train paragraphs; the benchmark's prompts come from the whole corpus, so
    the profile meets text it was not made from, as a user's would. The text is traced in windows of n_ctx;
    stride k traces every k-th paragraph of each topic (a big model traces slowly)."""
    if stride < 1:
        raise ParameterError(f"the profile's stride must be at least 1, not {stride}")
    from ...formats.profile import write_profile
    from ..synth.corpus import split_paragraphs
    from ..routing.ranking import make_profile
    from ..routing.routes import routes_from_records
    from ..routing.tracing import trace_text

    layout = expert_layout(model_path)
    split = split_paragraphs()
    text = "\n\n".join(p for topic in sorted(split.train) for p in split.train[topic][::stride])
    log(f"profile: tracing {len(text)} characters of train text")
    write_profile(out, make_profile(routes_from_records(trace_text(model_path, text, n_ctx=n_ctx)), layout))
    return out
