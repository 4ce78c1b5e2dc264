"""ARC (Megiddo and Modha) over one layer's expert slots, as the policy studies simulate it (the engine runs no
ARC): T1 holds the experts requested once since they entered, T2 those requested again; the ghosts B1 and B2
keep what each evicted, and a request of a ghost moves T1's target size p. The studies differ in two things,
the parameters here:

- ``protect``: a token's own experts never leave for another of them (the RAM tier reads every miss into a
  slot before computing it: ``ram_tier_policies.py``); without, the least recent entry of the list ARC picks
  leaves, whatever it is (the admitting hybrid computes its misses on the CPU: ``admit_policies.py``);
- ``admit``: the misses that enter per token, first missed first (the hybrid's admissions per layer and
  decode); None: every miss enters.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class Arc:
    """One layer's ARC of ``n_slots``, holding ``fill`` at the start in T1 (the first given leaves first)."""

    def __init__(self, n_slots: int, fill: Iterable[int], protect: bool, admit: int | None = None) -> None:
        self.c = n_slots
        self.protect = protect
        self.admit = admit
        self.t1: OrderedDict[int, None] = OrderedDict((e, None) for e in fill)  # least recent first, as each list
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0.0

    def _replace(self, in_b2: bool, mine: set[int]) -> None:
        """ARC's REPLACE: T1's least recent goes to B1 when T1 is over its target, else T2's to B2 (never one
        of ``mine``: from T1 when T2 has none other)."""
        x1 = next((e for e in self.t1 if e not in mine), None)
        x2 = next((e for e in self.t2 if e not in mine), None)
        if x1 is not None and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p) or x2 is None):
            del self.t1[x1]
            self.b1[x1] = None
        else:
            del self.t2[x2]
            self.b2[x2] = None

    def token(self, row: Iterable[int]) -> tuple[int, int]:
        """One token's requests, in the router's order: (hits, misses) of its distinct experts, the hits those
        held before it; then its misses enter (up to ``admit``), first missed first."""
        t1, t2, b1, b2, c = self.t1, self.t2, self.b1, self.b2, self.c
        hits, new = 0, []
        requested = list(dict.fromkeys(row))
        for e in requested:
            if e in t1:
                del t1[e]
                t2[e] = None
                hits += 1
            elif e in t2:
                t2.move_to_end(e)
                hits += 1
            else:
                new.append(e)
        mine = set(requested) if self.protect else set()
        for e in new if self.admit is None else new[:self.admit]:
            if e in b1:
                self.p = min(float(c), self.p + max(len(b2) / len(b1), 1.0))
                self._replace(False, mine)
                del b1[e]
                t2[e] = None
            elif e in b2:
                self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
                self._replace(True, mine)
                del b2[e]
                t2[e] = None
            else:
                if len(t1) + len(b1) == c:
                    if len(t1) < c:
                        b1.popitem(last=False)
                        self._replace(False, mine)
                    else:
                        del t1[next(x for x in t1 if x not in mine)]
                else:
                    total = len(t1) + len(t2) + len(b1) + len(b2)
                    if total >= c:
                        if total >= 2 * c:
                            b2.popitem(last=False)
                        if len(t1) + len(t2) >= c:
                            self._replace(False, mine)
                t1[e] = None
        return hits, len(new)

    def held(self) -> set[int]:
        return set(self.t1) | set(self.t2)
