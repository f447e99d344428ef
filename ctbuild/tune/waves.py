"""A bucket's `ctbuild.waves.WaveTable`s, fitted to the times its span raced.

For each layout class with `MIN_SIZES` raced sizes and two finalists at least (configs timed
at all of them and within the band of the fastest at one), each way to scale a finalist's
times from the raced sizes to a call's by its waves (the GPU holding 1 to 4 blocks per SM at
once) is judged by leaving each raced size out and serving it from the others: the way with
the least mean loss there is kept. The class gets the table only where that loss is below
both the loss of the same held-out choice unscaled (the nearest sizes' times alone: the waves
must explain something) and the mean loss, at the same sizes, of the configs the split serves
them with (those were chosen on those very sizes, so a held-out prediction that still beats
them is the better guess between them). Replayed on two H200 tunes, attention over ``BH x S``
served 150 drawn sizes with p95 9.6% -> 6.5% and max 47.6% -> 15.6% (another tune's: p95
3.0% -> 1.9%, max 48.0% -> 13.9%); no other kernel got a table that changed its losses.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

from ..space import Config
from ..waves import MAX_FINALISTS, MAX_REFS, Ref, WaveTable
from .choice import TieBand
from .span import Group, Span

#: The blocks per SM the GPU may hold at once, tried for each class.
PER_SM = (1, 2, 3, 4)
#: The fewest raced sizes a class's table is fitted on (one held out, `NEAREST` to serve it).
MIN_SIZES = 3


def fit(span: Span, groups: Sequence[Group], blocks_at: Callable[[Config, dict[str, int]], int],
        sms: int, order: Sequence[Config], band: TieBand) -> dict[str, WaveTable]:
    """Per layout class of ``span``'s raced sizes, its table, where it serves them better
    than ``groups`` do (``blocks_at(config, sizes)``: the block count of the config's grid;
    ``sms``: the GPU's SM count)."""
    classes = {span.cls(i) for i in range(len(span.sizes))}
    if "" in classes:
        return {}
    known: dict[tuple[Config, tuple[tuple[str, int], ...]], int] = {}

    def blocks(config: Config, sizes: dict[str, int]) -> int:  # each asked for many times
        key = (config, tuple(sorted(sizes.items())))
        if key not in known:
            known[key] = blocks_at(config, sizes)
        return known[key]
    out = {}
    for cls in sorted(classes):
        idx = [i for i in range(len(span.sizes)) if span.cls(i) == cls]
        table = _fit_class(span, groups, idx, blocks, sms, order, band)
        if table is not None:
            out[cls] = table
    return out


def _fit_class(span: Span, groups: Sequence[Group], idx: list[int],
               blocks_at: Callable[[Config, dict[str, int]], int], sms: int,
               order: Sequence[Config], band: TieBand) -> WaveTable | None:
    if not MIN_SIZES <= len(idx) <= MAX_REFS:  # more than a record's reader takes: none
        return None
    common = set.intersection(*(set(span.times[i]) for i in idx))
    near: set[Config] = set()
    for i in idx:
        reach = min(t.mean_us for t in span.times[i].values()) * (1 + band.percent / 100)
        near |= {c for c in common if span.times[i][c].mean_us <= reach}
    finalists = tuple(c for c in order if c in near)[:MAX_FINALISTS]
    if len(finalists) < 2:
        return None
    refs = tuple(Ref(span.sizes[i], tuple(span.times[i][c].mean_us for c in finalists),
                     tuple(blocks_at(c, span.sizes[i]) for c in finalists)) for i in idx)
    served = [span.loss(i, g.serves(span, i)) for g in groups for i in g.members
              if i in idx and g.serves(span, i) in span.times[i]]
    held: dict[int | None, float] = {}
    for slots in (None, *(k * sms for k in PER_SM)):
        table = WaveTable(finalists, refs, slots)
        losses = [span.loss(i, table.without(k).choose(span.sizes[i], partial(
            _blocks, blocks_at, span.sizes[i]))) for k, i in enumerate(idx)]
        held[slots] = sum(losses) / len(losses)
    slots = min((s for s in held if s is not None), key=lambda s: held[s])
    beaten = min(held[None], sum(served) / len(served)) if served else 0.0
    return WaveTable(finalists, refs, slots) if held[slots] < beaten else None


def _blocks(blocks_at: Callable[[Config, dict[str, int]], int], sizes: dict[str, int],
            config: Config) -> int:
    return blocks_at(config, sizes)
