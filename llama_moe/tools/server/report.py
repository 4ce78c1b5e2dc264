"""A running llama-server's report from its /metrics: the lines of the local report that they can fill
(``python -m llama_moe stats --server URL``)."""
from __future__ import annotations

from ...stats import cache_lines, engine_hit_rate
from .metrics import ServerMetrics


def format_server_report(server: str, m: ServerMetrics) -> str:
    """The local report's lines that a running llama-server's /metrics can fill."""
    c = m.moe_cache
    lines = [f"server       {server} ({m.requests_processing} requests processing)",
             f"prompt       {m.prompt_tokens} tokens at {m.prompt_tps:.1f} tok/s",
             f"generation   {m.tokens_predicted} tokens at {m.gen_tps:.1f} tok/s"]
    lines += cache_lines(c)
    if c is not None:
        lines.append(f"             {c.n_copy} experts copied from the cache by large batches, {c.n_swap} swapped in")
        lines += ["", "layer   hits  from profile  misses  refused  hit rate"]
        for il, (hits, prof, miss) in c.layers.items():
            refused = c.layers_refused.get(il, 0)
            rate = engine_hit_rate(hits, miss, refused)
            lines.append(f"{il:5d}  {hits:5d}  {prof:12d}  {miss:6d}  {refused:7d}  {rate:8.3f}")
    return "\n".join(lines)
