"""A layout class's config chosen per call, where its best config follows the waves its grid
makes: the number of rounds of blocks the GPU runs, ``ceil(blocks / slots)``.

Attention over ``BH x S`` on an H200 alternates between two configs as the sizes grow: where
one config's grid still fits the blocks the GPU holds at once and the other's spills into a
second wave, the first wins by up to 40% (at ``S=4095``: ``BM=64`` at ``BH=3``, 12 and
``BM=128`` at 5, 8, 15, 16). No split into boxes of sizes follows that (its winners lost up to
48% at sizes drawn between the raced ones). A `WaveTable` holds, for one layout class of a
bucket, its finalists' times at the raced sizes of that class, their block counts there, and
the blocks the GPU holds at once (``slots``, fitted by ``ctbuild tune``:
`ctbuild.tune.waves`). A call takes the finalist whose time at the `NEAREST` raced sizes,
scaled by its waves at the call over its waves there, is smallest (``slots`` None: its time
there alone). The table travels in a tuning record's ``by_class`` entry, from a cache that
may be shared: it is read defensively (`read_table`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .space import Config

#: How many raced sizes nearest a call predict its finalists' times.
NEAREST = 2
#: The most finalists and raced sizes a table read from a record may hold.
MAX_FINALISTS = 8
MAX_REFS = 128


def apart(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """How far apart two sizes of a bucket are: on the log scale, over its Dims."""
    return math.hypot(*(math.log(a[n] / b[n]) for n in a))


@dataclass(frozen=True)
class Ref:
    """One raced size of the class: per finalist (in the table's order) its time in
    microseconds and its grid's block count there."""
    sizes: dict[str, int]
    times: tuple[float, ...]
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class WaveTable:
    """The finalists of one layout class of a bucket, in space order, their times at its raced
    sizes, and the blocks the GPU holds at once (None: times are not scaled by waves); where
    read from a record, the config it serves the class with where no choice can be made (a
    grid function that raises at a call)."""
    finalists: tuple[Config, ...]
    refs: tuple[Ref, ...]
    slots: int | None
    fallback: Config | None = None

    def choose(self, sizes: Mapping[str, int], blocks: Callable[[Config], int]) -> Config:
        """The finalist predicted fastest at ``sizes`` (``blocks(config)``: its grid's block
        count there); a tie goes to the first in space order."""
        near = sorted(self.refs, key=lambda r: apart(sizes, r.sizes))[:NEAREST]

        def predicted(k: int) -> float:
            if self.slots is None:
                return sum(r.times[k] for r in near)
            here = _waves(blocks(self.finalists[k]), self.slots)
            return sum(r.times[k] * here / _waves(r.blocks[k], self.slots) for r in near)
        return self.finalists[min(range(len(self.finalists)), key=predicted)]

    def chosen_at(self, sizes: Mapping[str, int]) -> Config | None:
        """The finalist chosen at one of the table's raced sizes (each finalist's blocks there
        are its ref's), as a call of those sizes is served; None at any other size."""
        ref = next((r for r in self.refs if r.sizes == dict(sizes)), None)
        if ref is None:
            return None
        return self.choose(sizes, lambda c: ref.blocks[self.finalists.index(c)])

    def without(self, i: int) -> WaveTable:
        """This table less its ``i``-th raced size (to judge it there, held out)."""
        return WaveTable(self.finalists, self.refs[:i] + self.refs[i + 1:], self.slots,
                         self.fallback)

    def to_json(self) -> dict[str, Any]:
        return {"slots": self.slots, "finalists": [c.to_json() for c in self.finalists],
                "refs": [{"sizes": r.sizes, "us": list(r.times), "blocks": list(r.blocks)}
                         for r in self.refs]}


def describe(entry: Any) -> str:
    """What a record's ``by_class`` entry adds where it has a table (the CLI's bucket line and
    the report): "" where it has none."""
    raw = entry.get("waves") if isinstance(entry, dict) else None
    if not isinstance(raw, dict) or not isinstance(raw.get("finalists"), list):
        return ""
    finalists, slots = raw["finalists"], raw.get("slots")
    return (f" (each call: the fastest of {len(finalists)} finalists at the nearest raced "
            "sizes" + (f", scaled by its waves of {slots} blocks" if _count(slots) else "")
            + ")")


def _waves(blocks: int, slots: int) -> int:
    return max(1, -(-blocks // slots))


def read_table(raw: Any, kernel: str, dims: Sequence[str], fallback: Config
               ) -> WaveTable | None:
    """A record's ``waves`` entry over the bucket's ``dims`` (``fallback``: its class's
    config), or None where anything in it is not what `WaveTable.to_json` writes (too many
    finalists or sizes, a size not over exactly those Dims, a time not finite and positive, a
    block count not a positive int)."""
    if not isinstance(raw, dict):
        return None
    slots, finalists, refs = raw.get("slots"), raw.get("finalists"), raw.get("refs")
    if not (slots is None or _count(slots)) or not isinstance(finalists, list) or \
            not isinstance(refs, list) or not 2 <= len(finalists) <= MAX_FINALISTS or \
            not NEAREST <= len(refs) <= MAX_REFS:
        return None
    if not all(isinstance(c, dict) and all(isinstance(k, str) for k in c) for c in finalists):
        return None
    n = len(finalists)
    out = []
    for r in refs:
        sizes = r.get("sizes") if isinstance(r, dict) else None
        us, blocks = (r.get("us"), r.get("blocks")) if isinstance(r, dict) else (None, None)
        if not isinstance(sizes, dict) or sorted(sizes) != sorted(dims) or \
                not all(_count(v) for v in sizes.values()) or \
                not isinstance(us, list) or not isinstance(blocks, list) or \
                len(us) != n or len(blocks) != n or not all(_count(b) for b in blocks) or \
                not all(isinstance(t, (int, float)) and not isinstance(t, bool) and
                        math.isfinite(t) and t > 0 for t in us):
            return None
        out.append(Ref(dict(sizes), tuple(float(t) for t in us), tuple(blocks)))
    return WaveTable(tuple(Config(c, kernel) for c in finalists), tuple(out), slots, fallback)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2 ** 62
