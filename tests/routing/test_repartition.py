"""Online re-partitioning of the admitting hybrid's slots between layers (``admitN-repartR``), replayed by the
engine (``llama_moe.policy_replay``): the slots move to the layer whose miss curve gains from them, within the
same budget, and the replay misses less than equal slots."""
from __future__ import annotations

import numpy as np
import pytest

from llama_moe.errors import ParameterError
from llama_moe.policy_replay import LayerShape, PolicyReplay, ReplayPolicy
from llama_moe.tools.routing.policies import REPLAYS, run_policy
from llama_moe.tools.routing.policies.engine import engine_stream
from llama_moe.tools.routing.routes import Routes


def _one_token_routes(experts: np.ndarray) -> Routes:
    return Routes(tuple(range(experts.shape[1])), experts, np.arange(len(experts) + 1, dtype=np.int64))


def _two_layers(n_tokens: int, seed: int = 0) -> np.ndarray:
    """Layer 0 cycles through 12 experts, 2 a token (an LRU needs 12 slots to hit them all); layer 1 draws
    2 of 32 at random (slots barely help)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_tokens, 2, 2), dtype=np.int8)
    for t in range(n_tokens):
        out[t, 0] = [(2 * t) % 12, (2 * t + 1) % 12]
        out[t, 1] = rng.choice(32, 2, replace=False)
    return out


def test_the_admitting_replay_moves_slots_to_the_local_layer_and_misses_less(lib) -> None:
    routes = _one_token_routes(_two_layers(600))
    slots = {0: 8, 1: 8}
    equal = run_policy("admit2", routes, slots, 32, [])
    moved = run_policy("admit2-repart32", routes, slots, 32, [])
    assert moved.n_lookup == equal.n_lookup
    assert moved.n_repartition >= 1 and moved.n_moved >= 4
    assert moved.n_miss < equal.n_miss
    assert moved.per_layer[0][1] < equal.per_layer[0][1]
    assert moved.policy == "admit2-repart32" and REPLAYS["admit2-repart32"][0]
    shapes = [LayerShape(il, 32, 2, 1) for il in (0, 1)]
    with PolicyReplay(shapes, slots, ReplayPolicy("hybrid", admit=2, repartition=32)) as replay:
        replay.feed(engine_stream(routes))
        got = replay.result()
    now = {l.il: l.n_slots for l in got.layers}
    assert sum(now.values()) == 16 and now[0] >= 12 and now[1] >= 2  # moved, never made: within the floor (k)
    assert (got.n_hit, got.n_miss, got.n_moved, got.n_repartition) == (moved.n_hit, moved.n_miss, moved.n_moved,
                                                                       moved.n_repartition)
    assert got.n_repart_rounds == 600 // 32  # a round every 32 decodes, before the next


def test_a_bad_period_is_refused(lib) -> None:
    with pytest.raises(ParameterError, match="re-partitioning every -1 decodes"):
        PolicyReplay([LayerShape(0, 8, 2, 1)], {0: 4}, ReplayPolicy("hybrid", admit=2, repartition=-1))
