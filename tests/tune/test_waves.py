"""A layout class's config chosen per call by the waves its finalists' grids make: the table,
its fit to a span's times and its defensive reading (pure functions; the GPU figures are
`benchmarks/bucket_regret.py --measure`'s)."""
from __future__ import annotations

import math
from typing import Callable

import pytest

from ctbuild.bucket_map import class_winners, layout_class
from ctbuild.dims import Dim, buckets
from ctbuild.space import Config
from ctbuild.specs import Tensor, Workload
from ctbuild.tune.choice import TieBand, Timing
from ctbuild.tune.span import Span
from ctbuild.tune.waves import fit, serve
from ctbuild.waves import Ref, WaveTable, describe, read_table

SMS = 4  # a GPU of 4 SMs, two blocks of every config resident on each: 8 at once


def cfg(bm: int) -> Config:
    return Config({"BM": bm}, "k")


def blocks(c: Config, sizes: dict[str, int]) -> int:
    return sizes["B"] * -(-sizes["S"] // c["BM"])


def seconds(c: Config, sizes: dict[str, int]) -> float:
    """A kernel that runs 8 blocks at a time, a BM=128 block in 1.5x a BM=64 block's time:
    its time is its waves."""
    return -(-blocks(c, sizes) // (2 * SMS)) * (1.0 if c["BM"] == 64 else 1.5)


def _span(sizes: list[dict[str, int]], times=seconds) -> Span:
    two = Workload({"X": Tensor((Dim("B", 1, 16, buckets=[16]), Dim("S", 1, 1024,
                                                                    buckets=[1024])), "float16")})
    [b] = buckets(two)
    return Span(b, sizes, [{c: Timing(c, times(c, s), 0.0, 5) for c in (cfg(64), cfg(128))}
                           for s in sizes], classes=[layout_class(s) for s in sizes])


def test_a_table_predicts_each_finalists_waves_at_a_call():
    """At S=200 BM=128 makes 2 blocks a row and BM=64 4: with B=2 both fit one wave and the
    smaller tiles win; with B=3, BM=64 spills into a second wave and BM=128 wins."""
    refs = tuple(Ref(s, (seconds(cfg(64), s), seconds(cfg(128), s)),
                     (blocks(cfg(64), s), blocks(cfg(128), s)))
                 for s in ({"B": 1, "S": 250}, {"B": 1, "S": 130}))
    table = WaveTable((cfg(64), cfg(128)), refs, 2 * SMS)
    for b, want in ((2, cfg(64)), (3, cfg(128))):
        size = {"B": b, "S": 200}
        assert table.choose(size, lambda c, size=size: blocks(c, size)) == want
        assert min((cfg(64), cfg(128)), key=lambda c, size=size: seconds(c, size)) == want
    # not scaled by waves: the nearest sizes' times alone, where BM=64 is never slower
    assert WaveTable((cfg(64), cfg(128)), refs, None).choose(
        {"B": 3, "S": 200}, lambda c: 1 / 0) == cfg(64)


def test_a_span_whose_times_follow_waves_gets_a_table_that_serves_between_its_sizes():
    """Raced on a grid, times that are waves of 8 blocks, split at most once along each Dim:
    the fit finds 2 blocks per SM for the sizes of class ``B:n,S:n``, and its table serves
    sizes off the grid better than the split's winners (their boxes of sizes do not follow
    the waves)."""
    grid = [{"B": b, "S": s} for b in (1, 3, 5, 9, 16) for s in (33, 100, 300, 700, 1023)]
    sizes = [s for s in grid if s != {"B": 16, "S": 1023}] + [{"B": 16, "S": 1023}]
    span = _span(sizes)
    order, band = [cfg(64), cfg(128)], TieBand(2.0)
    groups, _ = span.split(order, None, band, limit=1)
    table = fit(span, groups, blocks, SMS, order, band)["B:n,S:n"]
    assert table.slots == 2 * SMS and table.finalists == (cfg(64), cfg(128))
    lost_split, lost_table = [], []
    for b in range(2, 16):
        for s in range(40, 1000, 37):
            size = {"B": b, "S": s}
            if layout_class(size) != "B:n,S:n":
                continue
            best = min(seconds(c, size) for c in order)
            group = next(g for g in groups if g.point is None or
                         all(size[n] <= g.point[n] for n in size))
            served = group.for_class(layout_class(size))
            lost_split.append(seconds(served, size) / best - 1)
            chosen = table.choose(size, lambda c, size=size: blocks(c, size))
            lost_table.append(seconds(chosen, size) / best - 1)
    assert len(lost_table) > 300 and max(lost_split) > 0.3 and max(lost_table) == 0
    # the record's loss at each raced size is what a call of that size is served with
    def lost(tables: dict[str, WaveTable]) -> list[float]:
        return [r["regret_pct"] for g in groups for r in span.regret_json(g, {}, None, tables)
                ["sizes"] if r["layout_class"] == "B:n,S:n"]
    assert max(lost({})) > 30 and max(lost({"B:n,S:n": table})) == 0


def test_a_class_one_config_serves_gets_no_table():
    """BM=64 is the fastest everywhere: the split serves every size without a loss, and no
    held-out prediction can beat that."""
    grid = [{"B": b, "S": s} for b in (1, 3, 5, 9, 16) for s in (64, 200, 513, 1023)]
    span = _span(grid, times=lambda c, s: s["B"] * s["S"] * (1.0 if c["BM"] == 64 else 1.2))
    groups, _ = span.split([cfg(64), cfg(128)], None, TieBand(2.0), limit=3)
    assert fit(span, groups, blocks, SMS, [cfg(64), cfg(128)], TieBand(2.0)) == {}


def test_a_class_the_split_serves_within_the_band_gets_no_table():
    """The finalists alternate with their waves, as in attention, but by 1.5% only: every
    config serves the class within the 2% band, so it keeps the split's config, though a
    table predicts every held-out size exactly (on two H200 tunes, tables fitted to tiny
    kernels' 2-3% losses differed between the tunes). By 30%, the class gets its table."""
    grid = [{"B": b, "S": s} for b in (1, 3, 5, 9, 16) for s in (33, 100, 300, 700, 1023)]

    def alternating(gap: float) -> Callable[[Config, dict[str, int]], float]:
        def times(c: Config, s: dict[str, int]) -> float:
            other = cfg(128 if c["BM"] == 64 else 64)
            return 1 + gap if seconds(c, s) > seconds(other, s) else 1.0
        return times
    for gap, fitted in ((0.015, False), (0.3, True)):
        span = _span(grid, times=alternating(gap))
        groups, _ = span.split([cfg(64), cfg(128)], None, TieBand(2.0), limit=0)
        assert bool(fit(span, groups, blocks, SMS, [cfg(64), cfg(128)], TieBand(2.0))) is fitted


def test_a_class_whose_nearest_sizes_predict_it_unscaled_gets_a_table_that_does_not_scale():
    """BM=64 30% faster at small B and large S and at large B and small S, BM=128 elsewhere,
    the same time at every size: no one config serves the bucket (limit 0: no split), the
    waves explain nothing, and the nearest raced sizes' times predict every held-out size."""
    sizes = [{"B": b, "S": s} for b in (2, 3, 5, 9, 11, 13) for s in (33, 51, 71, 701, 851, 1023)]

    def quadrants(c: Config, s: dict[str, int]) -> float:
        return 1.0 if (c["BM"] == 64) == ((s["B"] < 8) == (s["S"] > 400)) else 1.3
    span = _span(sizes, times=quadrants)
    groups, _ = span.split([cfg(64), cfg(128)], None, TieBand(2.0), limit=0)
    table = fit(span, groups, blocks, SMS, [cfg(64), cfg(128)], TieBand(2.0))["B:n,S:n"]
    assert table.slots is None
    for size in ({"B": 4, "S": 900}, {"B": 12, "S": 40}, {"B": 4, "S": 40}):
        want = min((cfg(64), cfg(128)), key=lambda c, size=size: quadrants(c, size))
        assert table.choose(size, lambda c: 1 / 0) == want


def test_a_bucket_whose_unaligned_sizes_a_table_serves_is_split_on_the_others_alone():
    """BM=64 is the fastest at every multiple of 16; elsewhere the finalists alternate with
    their waves (as attention's unaligned sizes do). Split on every size, the bucket spends
    its split limit on the alternation and still loses; the unaligned classes then get
    tables. Their tables serve them per call, so the bucket is split again on the aligned
    sizes alone: one part, no loss left to explain, the same tables."""
    def times(c: Config, s: dict[str, int]) -> float:
        return (1.0 if c["BM"] == 64 else 1.3) if s["S"] % 16 == 0 else seconds(c, s)
    grid = [{"B": b, "S": s} for b in (1, 3, 5, 9, 16)
            for s in (32, 33, 96, 100, 304, 300, 704, 700, 1023, 1024)]
    span = _span([s for s in grid if s != {"B": 16, "S": 1024}] + [{"B": 16, "S": 1024}],
                 times=times)
    order, band = [cfg(64), cfg(128)], TieBand(2.0)
    split, why = span.split(order, None, band, limit=3)
    assert len(split) > 1 and why == "the split limit (3) is reached"
    tables = fit(span, split, blocks, SMS, order, band)
    assert sorted(tables) == ["B:1,S:n", "B:16,S:n", "B:n,S:n"]
    groups, why, served = serve(span, order, None, band, 3, lambda points: None, blocks, SMS)
    assert [(g.point, g.winner, g.members) for g in groups] == [
        (None, cfg(64), list(range(len(span.sizes))))]
    assert why is None and sorted(served) == sorted(tables)
    for i, size in enumerate(span.sizes):
        table = served.get(span.cls(i))
        got = table.choose(size, lambda c, s=size: blocks(c, s)) if table else groups[0].winner
        assert span.loss(i, got) == 0, size
    # --no-refine: one winner, no table
    assert serve(span, order, None, band, 0, lambda points: None, blocks, SMS)[2] == {}


GOOD = {"slots": 8, "finalists": [{"BM": 64}, {"BM": 128}],
        "refs": [{"sizes": {"B": 1, "S": 250}, "us": [1.0, 1.0], "blocks": [4, 2]},
                 {"sizes": {"B": 1, "S": 130}, "us": [1.0, 2.0], "blocks": [3, 2]}]}


@pytest.mark.parametrize("bad", [
    [], {"slots": 0}, {**GOOD, "slots": True}, {**GOOD, "finalists": [{"BM": 64}]},
    {**GOOD, "finalists": [{"BM": 64}] * 9}, {**GOOD, "refs": GOOD["refs"][:1]},
    {**GOOD, "refs": GOOD["refs"] * 65}, {**GOOD, "finalists": [{"BM": 64}, [1]]},
    {**GOOD, "refs": [GOOD["refs"][0], {**GOOD["refs"][1], "us": [1.0, math.inf]}]},
    {**GOOD, "refs": [GOOD["refs"][0], {**GOOD["refs"][1], "us": [1.0, -2.0]}]},
    {**GOOD, "refs": [GOOD["refs"][0], {**GOOD["refs"][1], "us": [1.0]}]},
    {**GOOD, "refs": [GOOD["refs"][0], {**GOOD["refs"][1], "blocks": [0, 2]}]},
    {**GOOD, "refs": [GOOD["refs"][0], {**GOOD["refs"][1], "sizes": {"B": 1}}]},
    {**GOOD, "refs": [GOOD["refs"][0], {**GOOD["refs"][1], "sizes": {"B": 1, "S": "9"}}]},
])
def test_a_hostile_table_is_not_read_and_its_class_config_serves(bad):
    """A table from a shared cache that is not what ctbuild writes is refused whole: the
    class's own config serves, and the CLI and the report still describe the entry."""
    assert read_table(bad, "k", ["B", "S"], cfg(64)) is None
    assert class_winners({"B:n,S:n": {"config": {"BM": 128}, "waves": bad}}, "k") == \
        {"B:n,S:n": cfg(128)}
    assert isinstance(describe({"waves": bad}), str)


def test_a_written_table_reads_back_with_its_class_config_as_fallback():
    table = read_table(GOOD, "k", ["B", "S"], cfg(128))
    assert table is not None and table.slots == 8 and table.fallback == cfg(128)
    assert read_table(table.to_json(), "k", ["S", "B"], cfg(128)) == table
    [read] = class_winners({"B:n,S:n": {"config": {"BM": 128}, "waves": GOOD}}, "k").values()
    assert read == table
    assert describe({"config": {}, "waves": GOOD}) == (
        " (each call: the fastest of 2 finalists at the nearest raced sizes, scaled by its "
        "waves of 8 blocks)")
    unscaled = read_table({**GOOD, "slots": None}, "k", ["B", "S"], cfg(128))
    assert unscaled is not None and unscaled.slots is None
    assert describe({"config": {}, "waves": {**GOOD, "slots": None}}) == (
        " (each call: the fastest of 2 finalists at the nearest raced sizes)")
