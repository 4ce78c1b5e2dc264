"""Online re-partitioning of the admitting hybrid's slots between layers (``routing.repartition``): the shadow
stacks' histograms are the layers' LRU miss curves, the split follows them at the same budget within floors and
caps and only when it predicts enough fewer misses, and the admitting replay moves slots where they hit."""
from __future__ import annotations

import numpy as np
import pytest

from llama_moe.tools.routing.misscurves import lru_miss_curves
from llama_moe.tools.routing.policies import REPLAYS, drive, run_policy
from llama_moe.tools.routing.policies.admit import ADMIT_CHUNK_TOKENS, AdmitReplay
from llama_moe.tools.routing.repartition import HYSTERESIS, ShadowStack, kept_slots, target
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


def test_the_shadow_stacks_give_the_lru_miss_curves() -> None:
    rng = np.random.default_rng(3)
    n_expert = 16
    experts = np.stack([rng.choice(n_expert, 2, replace=False) for _ in range(400)])[:, None, :].astype(np.int8)
    curves = lru_miss_curves(_one_token_routes(experts), n_expert).total()[0]
    shadow = ShadowStack(n_expert)
    cold = 0
    for row in experts[:, 0].tolist():
        cold += sum(e not in shadow.stack for e in row)
        shadow.touch(row)
    for c in range(n_expert):  # held whole (c = n_expert) needs no lookup
        assert curves[c] == cold + sum(shadow.hist[c:]), c


def test_the_split_moves_slots_to_the_steeper_curve_within_floors_caps_and_budget() -> None:
    steep = [0, 0, 50, 40, 30, 20, 10, 0]  # hits up to depth 6: 6 -> 7 slots still gains
    flat = [0, 0, 1, 1, 1, 1, 1, 1]
    new = target([steep, flat], [4, 4], [2, 2], [7, 7])
    assert new is not None and sum(new) == 8 and new[0] > 4 and min(new) >= 2 and max(new) <= 7
    assert new == [6, 2]  # depth 6 (the 7th slot) gains 10, depth 2 of the flat one 1: the budget stops at 6
    # no split can gain 1/HYSTERESIS: none
    even = [0, 0, 5, 5, 5, 5, 5, 5]
    assert target([even, even], [4, 4], [2, 2], [7, 7]) is None
    assert HYSTERESIS > 1


def test_slots_no_curve_asks_for_stay_where_they_were() -> None:
    hot = [0, 9, 0, 0, 0, 0, 0, 0]  # one slot more than the floor is all it wants
    cold = [0] * 8
    # the slot the hot layer gains comes from the last layers: the first ones get their old share back first
    assert target([hot, cold, cold], [1, 5, 3], [1, 1, 1], [7, 7, 7]) == [2, 5, 2]


def test_a_shrinking_layer_keeps_its_most_recently_used_experts_in_slot_order() -> None:
    assert kept_slots([5, 6, 7, -1, 9], [3, 8, 8, 0, 1], 2) == [1, 2]
    assert kept_slots([5, 6, 7, -1, 9], [3, 1, 8, 0, 3], 2) == [0, 2]  # ties: the lower slot
    assert kept_slots([5, -1, 7], [3, 0, 1], 4) == [0, 2]


def test_the_admitting_replay_moves_slots_to_the_local_layer_and_misses_less() -> None:
    routes = _one_token_routes(_two_layers(600))
    slots = {0: 8, 1: 8}
    equal = run_policy("admit2", routes, slots, 32, [])
    rep = AdmitReplay(routes.layers, 2, slots, 32, [], 2, repartition=32)
    moved = drive(rep, routes, ADMIT_CHUNK_TOKENS, None)
    assert moved.n_lookup == equal.n_lookup
    assert moved.n_repartition >= 1 and moved.n_moved >= 4
    assert rep.history[0][0] % 32 == 0
    now = rep.slots_now()
    assert sum(now.values()) == 16 and now[0] >= 12 and now[1] >= 2
    assert moved.n_miss < equal.n_miss
    assert moved.per_layer[0][1] < equal.per_layer[0][1]
    assert moved.policy == "admit2-repart32"
    assert REPLAYS["admit2-repart32"][0]  # by name too
    same = run_policy("admit2-repart32", routes, slots, 32, [])
    assert (same.n_hit, same.n_miss, same.n_moved) == (moved.n_hit, moved.n_miss, moved.n_moved)


def test_a_bad_period_is_refused() -> None:
    with pytest.raises(ValueError, match="repartition"):
        AdmitReplay((0,), 2, {0: 4}, 8, [], 2, repartition=-1)
