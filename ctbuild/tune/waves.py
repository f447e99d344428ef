"""How a bucket's calls are served (`serve`): its split and its `ctbuild.waves.WaveTable`s,
fitted to the times its span raced.

A layout class gets a table only where the split leaves it a loss the band does not cover
(`ctbuild.tune.span.within` of the class's sizes in each group, CI included): a class the
split serves within the band keeps its config, so two tunes do not serve it by tables fitted
on noise (on two H200 tunes the earlier rule fitted tables on tiny kernels' 2-3% losses, and
the two tunes' tables differed). Its finalists are the configs timed at all of its raced sizes and
within the band of the fastest at one. Each way to predict a held-out raced size from the
others is judged by leaving each size out: the nearest sizes' times alone, or scaled by each
finalist's waves (the GPU holding 1 to 4 blocks per SM at once); the way with the least mean
loss there is kept (unscaled on a tie: it assumes less). The class gets the table where that
held-out loss is below the split's at the same sizes, on the mean and by a band on the worst
(its configs were chosen on those very sizes, so a held-out prediction that still beats them
is the better guess between them). Replayed on two H200 tunes, attention over ``BH x S``
served 150 drawn sizes with p95 9.6% -> 6.5% and max 47.6% -> 15.6% (another tune's: p95
3.0% -> 1.9%, max 48.0% -> 13.9%); no other kernel got a table there (one tune of another
pair fitted one to a GEMM class).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

from ..space import Config
from ..waves import MAX_FINALISTS, MAX_REFS, Ref, WaveTable
from .choice import TieBand
from .span import Group, Span, within

#: The blocks per SM the GPU may hold at once, tried for each class.
PER_SM = (1, 2, 3, 4)
#: The fewest raced sizes a class's table is fitted on (one held out, `NEAREST` to serve it).
MIN_SIZES = 3


def serve(span: Span, order: Sequence[Config], default: Config | None, band: TieBand,
          limit: int, refuse: Callable[[list[dict[str, int]]], str | None],
          blocks_at: Callable[[Config, dict[str, int]], int], sms: int
          ) -> tuple[list[Group], str | None, dict[str, WaveTable]]:
    """How a bucket's calls are served: its split (`Span.split`, with why it is not split
    further), and the tables of the layout classes that get one (`fit`). Where some classes
    get tables (and the upper bound's class none), the bucket is split again on the other
    classes' sizes alone, and that split kept where it has fewer parts and the same classes
    get tables: a class served per call by its table needs no split, and the points a split
    spent on it served the other classes' sizes by configs chosen at its own (attention over
    ``BH x S``: its unaligned sizes' best config alternates with the waves; the split served
    an aligned ``S=2048`` 21% slower than the config every aligned size wanted; split on the
    other classes, 7-12 parts became 1-6 and the largest loss as recorded 2.9-5.7%, replayed
    on three pairs of H200 tunes). ``limit`` 0 (``--no-refine``): one winner, no table."""
    groups, why = span.split(order, default, band, limit, refuse)
    if not limit:
        return groups, why, {}
    tables = fit(span, groups, blocks_at, sms, order, band)
    if not tables or span.cls(span.top) in tables:
        return groups, why, tables
    rest, rest_why = span.without(set(tables)).split(order, default, band, limit, refuse)
    fewer = span.regroup(rest)
    again = fit(span, fewer, blocks_at, sms, order, band)
    if len(fewer) < len(groups) and set(again) == set(tables):
        return fewer, rest_why, again
    return groups, why, tables


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
    served = [(i, g.serves(span, i)) for g in groups for i in g.members
              if i in idx and g.serves(span, i) in span.times[i]]
    if not served or not _short(span, groups, idx, band):
        return None
    held: dict[int | None, tuple[float, float]] = {}
    for slots in (None, *(k * sms for k in PER_SM)):
        table = WaveTable(finalists, refs, slots)
        losses = [span.loss(i, table.without(k).choose(span.sizes[i], partial(
            _blocks, blocks_at, span.sizes[i]))) for k, i in enumerate(idx)]
        held[slots] = (sum(losses) / len(losses), max(losses))
    slots = min(held, key=lambda s: (held[s][0], s is not None))
    split = [span.loss(i, c) for i, c in served]
    mean, worst = held[slots]
    better = mean < sum(split) / len(split) and worst <= max(split) - band.percent / 100
    return WaveTable(finalists, refs, slots) if better else None


def _short(span: Span, groups: Sequence[Group], idx: list[int], band: TieBand) -> bool:
    """Whether some group serves its sizes among the class's ``idx`` with a worst loss beyond
    the band, its CI included (`ctbuild.tune.span.within`)."""
    for g in groups:
        mine = [i for i in g.members if i in idx]
        if not mine:
            continue
        worst = span.worst_ci(mine).get(g.for_class(span.cls(mine[0])))
        if worst is not None and not within(*worst, band):
            return True
    return False


def _blocks(blocks_at: Callable[[Config, dict[str, int]], int], sizes: dict[str, int],
            config: Config) -> int:
    return blocks_at(config, sizes)
