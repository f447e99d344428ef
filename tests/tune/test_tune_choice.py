"""The tie rule, the race, a bucket's sizes and its splits: pure functions of measurements,
checked with simulated GPUs whose clocks drift (the GPU tests and
benchmarks/tune_reproducibility.py measure real ones)."""
from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from ctbuild.bucket_map import layout_class
from ctbuild.dims import Dim, buckets
from ctbuild.space import Config
from ctbuild.specs import Tensor, Workload
from ctbuild.tune.choice import (
    RULE_DEFAULT,
    RULE_FASTEST,
    RULE_FIRST,
    TieBand,
    TieBandError,
    Timing,
    choose,
)
from ctbuild.tune.race import RaceBudget, decided, finalists, race, round_timings
from ctbuild.tune.span import Span
from ctbuild.tune.span_sizes import span_sizes


def cfg(tile: int) -> Config:
    return Config({"TILE": tile}, "k")


SPACE = [cfg(t) for t in (64, 128, 256, 512)]


def timing(tile: int, mean: float, ci: float = 0.1) -> Timing:
    return Timing(cfg(tile), mean, ci, 10)


def test_tie_rule_default_then_space_order_then_fastest():
    band = TieBand(2.0)
    # 512 is fastest; 256 within 2%; 128 outside the band with a CI that does not reach
    ts = [timing(64, 130), timing(128, 104, 0.5), timing(256, 101.5), timing(512, 100)]
    c = choose(ts, SPACE, cfg(256), band)
    assert (c.winner.config, c.rule, c.fastest.config) == (cfg(256), RULE_DEFAULT, cfg(512))
    assert [t.config for t in c.ties] == [cfg(256), cfg(512)]          # in space order
    c = choose(ts, SPACE, cfg(64), band)                                 # default not tied
    assert (c.winner.config, c.rule) == (cfg(256), RULE_FIRST)
    # a CI that overlaps the fastest's is a tie too, even beyond the band
    wide = [timing(128, 104, 4.0), timing(512, 100)]
    assert choose(wide, SPACE, None, band).winner.config == cfg(128)
    # but at most twice the band: two samples of a config 20% behind do not tie with it
    noisy = [timing(128, 120, 25.0), timing(512, 100)]
    assert choose(noisy, SPACE, None, band).winner.config == cfg(512)
    alone = [timing(64, 130), timing(512, 100)]
    assert choose(alone, SPACE, cfg(64), band).rule == RULE_FASTEST


@pytest.mark.parametrize("text", ["0", "50", "-1", "75%", "two"])
def test_tie_band_outside_0_50_is_refused(text):
    with pytest.raises(TieBandError, match="tie band"):
        TieBand.parse(text)


def test_tie_band_parses_percent():
    assert TieBand.parse("2%").percent == 2.0 and TieBand.parse(" 0.5 ").factor == 1.005


class DriftingGpu:
    """True times per config, a clock that drifts by up to 15% over the run and 1% noise."""

    def __init__(self, true: dict[Config, float], seed: int) -> None:
        self.true, self.rng, self.t = true, random.Random(seed), 0

    def sample(self, c: Config) -> float:
        self.t += 1
        clock = 1.0 + 0.15 * math.sin(self.t / 40.0)
        return self.true[c] * clock * (1 + self.rng.gauss(0, 0.01))


def test_runoff_cancels_drift_and_two_runs_agree():
    """Four near-equal configs and one 6% slower: measured one after another under the drift,
    their order is the clock's; interleaved, every run decides the same ties and winner."""
    true = {cfg(64): 100.0, cfg(128): 100.5, cfg(256): 101.0, cfg(512): 106.0}
    winners = set()
    for seed in range(6):
        gpu = DriftingGpu(true, seed)
        result = race(list(true), gpu.sample, TieBand(2.0), RaceBudget(max_seconds=60))
        c = choose(result.timings, SPACE, None, TieBand(2.0))
        assert cfg(512) not in [t.config for t in c.ties]
        winners.add(c.winner.config)
    assert winners == {cfg(64)}


def test_runoff_drops_a_failing_finalist():
    def sample(c: Config) -> float:
        if c == cfg(128):
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")
        return {64: 10.0, 256: 20.0}[c.TILE]
    result = race([cfg(64), cfg(128), cfg(256)], sample, TieBand(2.0))
    assert [c for c, _ in result.failures] == [cfg(128)]
    assert {t.config for t in result.timings} == {cfg(64), cfg(256)}
    assert result.dropped == (cfg(256),)  # twice as slow: dropped after its first round
    assert result.stopped == "one candidate left" and result.rounds == 1


def test_a_race_drops_the_surely_slower_and_measures_the_rest():
    """Ten configs, two near the fastest: the eight far behind stop being measured after a
    round or two; the three left are decided as the tie rule needs."""
    true = {cfg(t): 100.0 + (0.5 * t if t < 3 else 10.0 * t) for t in range(10)}
    gpu = DriftingGpu(true, 1)
    counts: dict[Config, int] = {}

    def sample(c: Config) -> float:
        counts[c] = counts.get(c, 0) + 1
        return gpu.sample(c)
    result = race(list(true), sample, TieBand(2.0), RaceBudget(max_seconds=60))
    assert set(result.dropped) == {cfg(t) for t in range(3, 10)}
    assert all(counts[cfg(t)] <= 2 * 3 for t in range(3, 10))
    assert min(counts[cfg(t)] for t in range(3)) >= 5 * 3
    assert choose(result.timings, list(true), None, TieBand(2.0)).winner.config == cfg(0)


def test_round_timings_and_decided():
    rounds = [{cfg(64): 10.0 * k, cfg(128): 20.0 * k} for k in (1.0, 1.1, 0.9)]
    ts = {t.config: t for t in round_timings(rounds)}
    assert ts[cfg(128)].mean_us / ts[cfg(64)].mean_us == pytest.approx(2.0)
    assert ts[cfg(64)].ci_us == pytest.approx(0.0, abs=1e-9)           # drift cancelled
    assert round_timings(rounds, only={cfg(128)}) == [ts[cfg(128)]]       # the same clock
    assert decided(list(ts.values()), TieBand(2.0))
    close = [timing(64, 100, 1.5), timing(128, 101, 1.5)]                 # could be either
    assert not decided(close, TieBand(2.0))


def test_finalists_keep_the_near_ones_and_the_default():
    screened = [timing(64, 100), timing(128, 105), timing(256, 150), timing(512, 104)]
    got = finalists(screened, TieBand(2.0), cfg(128), limit=2)
    assert [t.config for t in got] == [cfg(64), cfg(128)]               # default replaces 512
    assert cfg(256) not in [t.config for t in finalists(screened, TieBand(2.0), None)]


def test_span_sizes_lower_bound_powers_of_two_and_one_above_and_midpoints():
    from ctbuild.tune.span_sizes import dim_points
    # then widest gaps, their midpoints on multiples of 16 (the other layout class than the
    # sizes one above a power of two); below a top that is a multiple of 16, the size one
    # below it
    assert dim_points(129, 1024) == [129, 256, 257, 368, 512, 513, 720, 1023]
    # an octave left below the top: its midpoint too (a split's top run is then not raced
    # at the upper bound alone)
    assert dim_points(16, 256) == [16, 32, 33, 64, 65, 128, 129, 176, 255]
    assert dim_points(1, 1 << 24) == [1, 256, 257, 65536, 65537, 1 << 23, (1 << 23) + 1,
                                      11863280, (1 << 24) - 1]
    assert dim_points(129, 1024, 5) == [129, 256, 257, 512, 513, 720, 1023]
    assert dim_points(1, 16, 5) == [1, 4, 5, 8, 9, 12, 15]
    assert dim_points(1, 2) == [1] and dim_points(7, 8) == [7]
    w = Workload({"X": Tensor((Dim("M", 1, 4096), 64), "float16")})
    by_top = {b.to_json()["M"]: b for b in buckets(w)}
    assert span_sizes(by_top[1024]) == [{"M": 513}, {"M": 608}, {"M": 720}, {"M": 864},
                                        {"M": 1023}]
    assert span_sizes(by_top[1]) == []                                   # one size only
    two = Workload({"X": Tensor((Dim("B", 1, 8, buckets=[2, 8]), Dim("S", 16, 8192,
                                                                      buckets=[1024, 8192]),
                                 64), "float16")})
    [b] = [b for b in buckets(two) if b.to_json() == {"B": 8, "S": 8192}]
    sizes = span_sizes(b)
    b_pts, s_pts = [3, 4, 5, 6], [1025, 2048, 4096, 4097, 5792, 8191]
    assert sizes[:4] == [{"B": n, "S": 8192} for n in b_pts]            # the lines first
    assert sizes[4:10] == [{"B": 8, "S": n} for n in s_pts]
    grid = [{"B": x, "S": y} for x in [*b_pts, 8] for y in [*s_pts, 8192]]
    assert sorted(map(str, sizes)) == sorted(str(g) for g in grid[:-1])  # then the grid
    three = Workload({"X": Tensor(tuple(Dim(n, 1, 64, buckets=[64]) for n in "ABC"),
                                  "float16")})
    [b3] = buckets(three)
    lines = 3 * len(dim_points(1, 64, 4))
    assert len(span_sizes(b3)) == lines + 2                  # no 216-size grid: corner, middle
    assert {"A": 1, "B": 1, "C": 1} in span_sizes(b3)


def _span(bucket, rows: dict[str, dict[int, float]], classes: bool = False) -> Span:
    """A span of ``bucket`` with times per size (its key) and TILE config (``classes``: and
    the sizes' layout classes, as `measure_span` gives them)."""
    sizes = [dict(x.split("=") for x in k.split(",")) for k in rows]
    sizes = [{n: int(v) for n, v in s.items()} for s in sizes]
    times = [{cfg(t): Timing(cfg(t), us, 0.0, 5) for t, us in r.items()} for r in rows.values()]
    return Span(bucket, sizes, times, classes=[layout_class(x) for x in sizes] if classes else [])


def test_a_span_picks_the_smallest_worst_loss_and_splits_along_the_lossy_dim():
    two = Workload({"X": Tensor((Dim("B", 1, 8), Dim("S", 16, 8192), 64), "float16")})
    [b] = [b for b in buckets(two) if b.to_json() == {"B": 8, "S": 8192}]
    order, band = [cfg(64), cfg(128), cfg(256)], TieBand(2.0)
    # 64 wins at the top, 128 loses 1% there and 1.5% at S=1025: 128 is good everywhere.
    span = _span(b, {"B=1,S=8192": {64: 10, 128: 10.1, 256: 12},
                     "B=8,S=16": {64: 11, 128: 10.15, 256: 10},
                     "B=8,S=8192": {64: 100, 128: 101, 256: 120}})
    [g], why = span.split(order, None, band, limit=2)
    assert g.winner == cfg(128) and why is None
    # 256 is 20% faster at small S and 20% slower at the top: split along S at S=16; B (1%
    # either way) is not the Dim that carries the loss.
    span = _span(b, {"B=1,S=8192": {64: 10, 256: 10.1},
                     "B=8,S=16": {64: 12, 256: 10},
                     "B=8,S=91": {64: 12, 256: 10},
                     "B=8,S=8192": {64: 100, 256: 120}})
    groups, why = span.split(order, None, band, limit=2)
    assert [(g.winner, g.point) for g in groups] == [(cfg(256), {"B": 8, "S": 91}),
                                                    (cfg(64), None)]
    assert why is None  # along S: B (1% either way) is not the Dim that carries the loss
    # No split allowed: one winner (the smaller worst loss, 17%) and why.
    [g], why = span.split(order, None, band, limit=0)
    assert g.winner == cfg(64) and why == "splitting is off (--no-refine)"


def test_a_span_ties_worst_losses_whose_cis_overlap():
    """The default loses 3% at S=16 where 128 loses nothing: beyond the 2% band. Timed there
    to within 1.5% (the CIs overlap), the two tie and the default wins, as two tunes of that
    noise would agree; timed to within 0.1%, 128 wins. The record says each worst loss's CI."""
    one = Workload({"X": Tensor((Dim("S", 16, 8192), 64), "float16")})
    [b] = [b for b in buckets(one) if b.to_json() == {"S": 8192}]
    order, band = [cfg(64), cfg(128)], TieBand(2.0)
    for ci, winner in ((0.15, cfg(64)), (0.01, cfg(128))):
        times = [{cfg(64): Timing(cfg(64), 10.3, ci, 5), cfg(128): Timing(cfg(128), 10, ci, 5)},
                 {cfg(64): Timing(cfg(64), 100, 0.0, 5), cfg(128): Timing(cfg(128), 100, 0, 5)}]
        span = Span(b, [{"S": 16}, {"S": 8192}], times)
        [g], _ = span.split(order, cfg(64), band, limit=0)
        assert g.winner == winner, ci
        worst = {json.dumps(w["config"]): w for w in span.regret_json(g, b.to_json())["worst"]}
        assert worst[json.dumps(cfg(64).to_json())]["worst_pct"] == 3.0
        assert worst[json.dumps(cfg(64).to_json())]["ci_pct"] == pytest.approx(
            100 * 1.03 * math.hypot(ci / 10.3, ci / 10), abs=1e-3)


def test_a_bucket_whose_worst_loss_is_within_its_ci_of_the_band_is_served_whole():
    """Two layout classes, each config 2.5% behind at the other's sizes: beyond the 2% band.
    Timed to within 1.2%, the loss may be inside the band: the bucket keeps one winner, as a
    second tune of that noise would (split or given class winners on noise, the two served
    it differently). Timed to within 0.1%, each class gets its own winner."""
    one = Workload({"X": Tensor((Dim("S", 16, 8192), 64), "float16")})
    [b] = [b for b in buckets(one) if b.to_json() == {"S": 8192}]
    order, band = [cfg(64), cfg(128)], TieBand(2.0)
    sizes = [{"S": 17}, {"S": 1025}, {"S": 4096}, {"S": 8192}]
    for ci, classes in ((0.12, {}), (0.01, {"S:16": cfg(64), "S:n": cfg(128)})):
        times = [{cfg(64): Timing(cfg(64), 10.25 if s["S"] % 16 else 10, ci, 5),
                  cfg(128): Timing(cfg(128), 10 if s["S"] % 16 else 10.25, ci, 5)}
                 for s in sizes]
        span = Span(b, sizes, times, classes=[layout_class(s) for s in sizes])
        [g], why = span.split(order, cfg(64), band, limit=3)
        assert (g.winner, g.by_class, why) == (cfg(64), classes, None), ci


def test_a_loss_far_beyond_the_band_is_split_however_wide_its_ci():
    """TILE=64 is 15% behind at the lower sizes, 128 as far behind at the top; timed on two
    samples each (CIs of 20%, a race that ended on its budget). A CI widens the band by the
    band at most: the bucket is split, where a CI that excused any loss served it whole."""
    one = Workload({"X": Tensor((Dim("S", 16, 1024), 64), "float16")})
    [b] = [b for b in buckets(one) if b.to_json() == {"S": 1024}]
    rows = {16: (11.5, 10), 64: (11.5, 10), 256: (10, 11.5), 1024: (10, 11.5)}
    span = Span(b, [{"S": n} for n in rows], [{cfg(64): Timing(cfg(64), a, 2.0, 2),
                                               cfg(128): Timing(cfg(128), c, 2.0, 2)}
                                              for a, c in rows.values()])
    groups, why = span.split([cfg(64), cfg(128)], cfg(64), TieBand(2.0), limit=3)
    assert [(g.winner, g.point) for g in groups] == [(cfg(128), {"S": 64}), (cfg(64), None)]
    assert why is None


def test_a_split_whose_parts_are_within_their_cis_of_the_band_says_nothing_is_left():
    """TILE=64 is 30% faster at S=16 only; 128 serves the rest, 2.5% behind at S=64 timed to
    within 1.2%: inside the band by its CI, as the split judged it. The split leaves no loss
    to explain, so the bucket gives no reason for not splitting further."""
    one = Workload({"X": Tensor((Dim("S", 16, 1024), 64), "float16")})
    [b] = [b for b in buckets(one) if b.to_json() == {"S": 1024}]
    rows = {16: (10, 13), 64: (10, 10.25), 256: (13, 10), 1024: (13, 10)}
    sizes = [{"S": n} for n in rows]
    span = Span(b, sizes, [{cfg(64): Timing(cfg(64), a, 0.12, 5),
                            cfg(128): Timing(cfg(128), c, 0.12, 5)} for a, c in rows.values()])
    groups, why = span.split([cfg(64), cfg(128)], None, TieBand(2.0), limit=3)
    assert [(g.winner, g.point) for g in groups] == [(cfg(64), {"S": 16}), (cfg(128), None)]
    assert round(100 * groups[-1].worst_pct, 1) == 2.5 and why is None


def test_class_winners_serve_where_one_class_keeps_its_loss():
    """TILE=64 loses 10% at S=33 (no config serves both unaligned sizes within the band) and
    5% at the multiples of 16, where 128 loses nothing. The bucket cannot be split (its key
    would clash): the multiples of 16 still get their own winner, though the unaligned
    sizes' worst loss stays 10%."""
    one = Workload({"X": Tensor((Dim("S", 16, 8192), 64), "float16")})
    [b] = [b for b in buckets(one) if b.to_json() == {"S": 128}]
    times = {17: {64: 10, 128: 12, 256: 11}, 33: {64: 11, 128: 12, 256: 10},
             64: {64: 10.5, 128: 10, 256: 12}, 128: {64: 10.5, 128: 10, 256: 12}}
    span = _span(b, {f"S={n}": t for n, t in times.items()}, classes=True)
    [g], why = span.split([cfg(64), cfg(128), cfg(256)], None, TieBand(2.0), limit=3,
                          refuse=lambda points: "the key clashes")
    assert (g.winner, g.by_class, why) == (cfg(128), {"S:16": cfg(128), "S:n": cfg(64)},
                                           "the key clashes")
    assert round(100 * g.worst_pct) == 10


def test_verify_contenders_skip_what_a_hostile_record_holds():
    """A record read from a shared cache: malformed ties, finalists and candidates are skipped;
    the winner comes first, nothing twice."""
    from ctbuild.records import TuningRecord
    from ctbuild.tune.verify import contenders
    rec = TuningRecord(kernel="k", config={"TILE": 64},
                       choice={"ties": [{"config": {"TILE": 64}}, "junk", {"config": 3}]},
                       runoff={"finalists": {"not": "a list"}},
                       candidates=[{"config": {"TILE": 128}}, None, {"mean_us": 1.0}])
    assert contenders(rec) == [{"TILE": 64}, {"TILE": 128}]
    assert contenders(TuningRecord(kernel="k", config={"TILE": 64}, choice="x",  # type: ignore
                                   runoff=[1], candidates="y")) == [{"TILE": 64}]  # type: ignore


def test_a_dropped_candidate_stays_on_the_survivors_clock():
    """Dropped after a few rounds while the clock drifts by 15%: its time, over the fastest's
    measured to the end, is still its true ratio (both divided by the same rounds' means)."""
    true = {cfg(64): 100.0, cfg(128): 101.0, cfg(256): 112.0, cfg(512): 140.0}
    for seed in range(4):
        result = race(list(true), DriftingGpu(true, seed).sample, TieBand(2.0),
                      RaceBudget(max_seconds=60))
        ts = {t.config: t.mean_us for t in result.timings}
        assert set(result.dropped) >= {cfg(256), cfg(512)}
        assert ts[cfg(256)] / ts[cfg(64)] == pytest.approx(1.12, rel=0.015)
        assert ts[cfg(512)] / ts[cfg(64)] == pytest.approx(1.40, rel=0.05)  # one round


def test_a_split_along_a_dim_weighs_the_sizes_off_its_line():
    """Along S one config is good everywhere, but the corner (B and S at their lower bounds)
    wants another: the sub-bucket of the small S holds the corner, so S is split there."""
    two = Workload({"X": Tensor((Dim("B", 1, 8), Dim("S", 16, 8192), 64), "float16")})
    [b] = [b for b in buckets(two) if b.to_json() == {"B": 8, "S": 8192}]
    span = _span(b, {"B=1,S=8192": {64: 10, 256: 12},
                     "B=8,S=16": {64: 10, 256: 10},
                     "B=8,S=91": {64: 10, 256: 11},
                     "B=1,S=16": {64: 12, 256: 10},
                     "B=8,S=8192": {64: 100, 256: 120}})
    groups, why = span.split([cfg(64), cfg(256)], None, TieBand(2.0), limit=2)
    assert [(g.winner, g.point) for g in groups] == [(cfg(256), {"B": 8, "S": 16}),
                                                    (cfg(64), None)]
    assert why is None


def test_a_refused_split_leaves_the_bucket_whole_or_takes_another_dim():
    """``refuse`` (the tuner's: the split points' tuning keys would clash) judges each Dim's
    split: a refused one is not taken, another Dim's is; where every one is refused the bucket
    stays whole and says why. Here only the corner wants TILE=256: splitting along either Dim
    serves it apart."""
    two = Workload({"X": Tensor((Dim("B", 1, 8), Dim("S", 16, 8192), 64), "float16")})
    [b] = [b for b in buckets(two) if b.to_json() == {"B": 8, "S": 8192}]
    span = _span(b, {"B=1,S=8192": {64: 10, 256: 10},
                     "B=8,S=16": {64: 10, 256: 10},
                     "B=1,S=16": {64: 13, 256: 10},
                     "B=8,S=8192": {64: 100, 256: 130}})
    order, band = [cfg(64), cfg(256)], TieBand(2.0)

    def split(refuse=None):
        groups, why = span.split(order, None, band, limit=2, refuse=refuse)
        return [(g.winner, g.point) for g in groups], why
    assert split() == ([(cfg(256), {"B": 1, "S": 8192}), (cfg(64), None)], None)
    assert split(lambda pts: "B" if any(p["B"] < 8 for p in pts) else None) == \
        ([(cfg(256), {"B": 8, "S": 16}), (cfg(64), None)], None)
    assert split(lambda pts: "keys clash") == ([(cfg(64), None)], "keys clash")


def test_a_split_past_its_limit_merges_its_lowest_runs_and_says_so():
    """From the top down: 256 alone (no config within the band over 128 and 256), 64 and 128
    (256 serves both), 16 (64): three runs, two splits. With one split allowed the lowest two
    runs merge, and the record says the limit stopped it."""
    one = Workload({"X": Tensor((Dim("S", 16, 256, buckets=[256]), 64), "float16")})
    [b] = buckets(one)
    span = _span(b, {"S=16": {64: 10, 256: 15},
                     "S=64": {64: 13, 256: 10},
                     "S=128": {64: 13, 256: 10},
                     "S=256": {64: 10, 256: 11}})
    order, band = [cfg(64), cfg(256)], TieBand(2.0)
    groups, why = span.split(order, None, band, limit=2)
    assert [(g.winner, g.point) for g in groups] == \
        [(cfg(64), {"S": 16}), (cfg(256), {"S": 128}), (cfg(64), None)] and why is None
    groups, why = span.split(order, None, band, limit=1)
    assert max(g.worst_pct for g in groups) > 0.02 and why == "the split limit (1) is reached"


def test_a_lower_part_of_a_split_is_split_again_along_another_dim():
    """On a grid: up to S=91, B=1 wants TILE=128 and B=8 wants 256; above it 64 serves every
    B. Split along S at 91, then that lower part along B at 1 (its points before its corner's):
    no size loses, and the runtime's first matching point serves each."""
    from ctbuild.bucket_map import read_splits, split_for
    two = Workload({"X": Tensor((Dim("B", 1, 8, buckets=[8]),
                                 Dim("S", 16, 8192, buckets=[8192]), 64), "float16")})
    [b] = [b for b in buckets(two) if b.to_json() == {"B": 8, "S": 8192}]
    small_b, large_b = {64: 13, 128: 10, 256: 13}, {64: 13, 128: 13, 256: 10}
    span = _span(b, {"B=1,S=16": small_b, "B=1,S=91": small_b, "B=8,S=16": large_b,
                     "B=8,S=91": large_b, "B=1,S=8192": {64: 10, 128: 13, 256: 13},
                     "B=8,S=8192": {64: 100, 128: 130, 256: 130}})
    groups, why = span.split([cfg(64), cfg(128), cfg(256)], None, TieBand(2.0), limit=3)
    assert [(g.winner, g.point, g.worst_pct) for g in groups] == [
        (cfg(128), {"B": 1, "S": 91}, 0.0), (cfg(256), {"B": 8, "S": 91}, 0.0),
        (cfg(64), None, 0.0)] and why is None
    splits = read_splits({"splits": [{"sizes": g.point} for g in groups[:-1]]}, b)
    assert split_for(splits, {"B": 1, "S": 50}).sizes == {"B": 1, "S": 91}
    assert split_for(splits, {"B": 4, "S": 50}).sizes == {"B": 8, "S": 91}
    assert split_for(splits, {"B": 1, "S": 500}) is None
    assert splits[1].sub_bucket(b, splits[:1]).lower_bounds() == {"B": 2, "S": 16}


def test_the_top_of_a_split_is_split_again_along_another_dim():
    """B=1 wants TILE=128 at every S, B=8 wants 256 at small S and 64 at the top: split along
    B at 1, then the part B=8 along S at 91; the runtime's first matching point serves each."""
    from ctbuild.bucket_map import read_splits, split_for
    two = Workload({"X": Tensor((Dim("B", 1, 8, buckets=[8]),
                                 Dim("S", 16, 8192, buckets=[8192]), 64), "float16")})
    [b] = [b for b in buckets(two) if b.to_json() == {"B": 8, "S": 8192}]
    span = _span(b, {"B=1,S=8192": {64: 13, 128: 10, 256: 13},
                     "B=8,S=16": {64: 13, 128: 13, 256: 10},
                     "B=8,S=91": {64: 13, 128: 13, 256: 10},
                     "B=1,S=16": {64: 13, 128: 10, 256: 13},
                     "B=8,S=8192": {64: 100, 128: 130, 256: 130}})
    order = [cfg(64), cfg(128), cfg(256)]
    groups, why = span.split(order, None, TieBand(2.0), limit=3)
    assert [(g.winner, g.point, g.worst_pct) for g in groups] == [
        (cfg(128), {"B": 1, "S": 8192}, 0.0), (cfg(256), {"B": 8, "S": 91}, 0.0),
        (cfg(64), None, 0.0)] and why is None
    splits = read_splits({"splits": [{"sizes": g.point} for g in groups[:-1]]}, b)
    assert split_for(splits, {"B": 1, "S": 50}).sizes == {"B": 1, "S": 8192}
    assert split_for(splits, {"B": 4, "S": 50}).sizes == {"B": 8, "S": 91}
    assert split_for(splits, {"B": 4, "S": 500}) is None
    # the limit is per Dim: one split along B and one along S still serve every size
    groups, why = span.split(order, None, TieBand(2.0), limit=1)
    assert [g.point for g in groups] == [{"B": 1, "S": 8192}, {"B": 8, "S": 91}, None]
    assert why is None


def test_sizes_between_the_bounds_race_only_who_was_near_somewhere():
    """The lower bound races every candidate; a size between the bounds skips a config far
    behind at every size raced before it, but still races the kept winner and default, and a
    config near the fastest only at the lower bound. The skipped one never serves there."""
    from ctbuild.dims import concretize
    from ctbuild.tune.measuring import measure_span
    w = Workload({"X": Tensor((Dim("M", 1, 1024),), "float16")})
    [b] = [b for b in buckets(w) if b.to_json() == {"M": 1024}]
    # 64 is best (only) at the lower bound, 512 near everywhere, 256 and 128 (kept) far.
    speed = {64: lambda m: m / 10 - 20, 128: lambda m: 40 + m / 40, 256: lambda m: 200 + m,
             512: lambda m: 30 + m / 60}
    seen: dict[int, set[int]] = {}

    def timer_for(cw):
        m = cw["X"].shape[0]

        def sample(c: Config) -> float:
            seen.setdefault(m, set()).add(c["TILE"])
            return speed[c["TILE"]](m)
        return sample
    top = {cfg(t): Timing(cfg(t), f(1024), 0.0, 5) for t, f in speed.items()}
    span, failures = measure_span(b, list(top), top, timer_for, TieBand(2.0), keep=[cfg(128)])
    low = b.lower_bounds()["M"]
    assert failures == [] and seen[low] == {64, 128, 256, 512}          # the bound: all
    inner = [s["M"] for s in span.sizes[:-1] if s["M"] != low]
    assert inner and all(seen[m] == {64, 128, 512} for m in inner)      # 256: far everywhere
    assert [s["M"] for s in span.sizes] == sorted(s["M"] for s in span.sizes)
    assert span.races[0]["raced"] == 4 and span.races[1]["raced"] == 3
    assert concretize(b.declared, span.sizes[0])["X"].shape == (low,)
    groups, _ = span.split(SPACE + [cfg(t) for t in (64,)], None, TieBand(2.0), limit=3)
    assert cfg(256) not in {g.winner for g in groups}


def test_a_size_no_candidate_could_be_timed_at_keeps_their_failures():
    """Every candidate raises at the lower bound (a CUBIN missing for its layout class, a
    launch error): the size is left out, and each candidate's error there is a failure of the
    key naming the size. They were dropped with the size: a tune reported no failure at all
    while a third of the bucket's sizes could not be launched."""
    from ctbuild.tune.measuring import measure_span
    w = Workload({"X": Tensor((Dim("M", 1, 1024),), "float16")})
    [b] = [b for b in buckets(w) if b.to_json() == {"M": 1024}]
    low = b.lower_bounds()["M"]

    def timer_for(cw):
        def sample(c: Config) -> float:
            if cw["X"].shape[0] == low:
                raise RuntimeError(f"no CUBIN for TILE={c['TILE']}")
            return float(c["TILE"])
        return sample
    top = {cfg(t): Timing(cfg(t), float(t), 0.0, 5) for t in (64, 128)}
    span, failures = measure_span(b, list(top), top, timer_for, TieBand(2.0))
    assert {s["M"] for s in span.sizes}.isdisjoint({low})
    assert sorted(f["config"]["TILE"] for f in failures) == [64, 128]
    assert all(f"at {{'M': {low}}}: RuntimeError: no CUBIN" in f["error"] for f in failures)
    assert span.problems[0] == f"{{'M': {low}}}: no candidate could be timed"


def test_a_span_race_of_a_tiny_kernel_stops_once_timed_to_its_floor():
    """Three ~3 us configs with 4% noise: a 1% precision alone (0.03 us) runs to the round
    cap; the span budget's 0.05 us floor stops as soon as the CIs reach it. Every round takes
    three samples a candidate (the first after an untimed first launch)."""
    from ctbuild.tune.race import SPAN_BUDGET
    true = {cfg(64): 3.0, cfg(128): 3.01, cfg(256): 3.02}

    def run(budget: RaceBudget) -> tuple[int, str, int]:
        rng, calls = random.Random(7), []

        def sample(c: Config) -> float:
            calls.append(c)
            return true[c] * (1 + rng.gauss(0, 0.04))
        result = race(list(true), sample, TieBand(2.0), budget)
        return result.rounds, result.stopped, len(calls)
    no_floor = dataclasses.replace(SPAN_BUDGET, floor_us=0.0, max_seconds=60)
    assert run(no_floor)[:2] == (SPAN_BUDGET.max_rounds, "budget: rounds")
    rounds, stopped, calls = run(dataclasses.replace(SPAN_BUDGET, max_seconds=60))
    assert stopped == "precise" and rounds < SPAN_BUDGET.max_rounds
    assert calls == 3 * (1 + 3) + 3 * 3 * (rounds - 1)


def test_a_split_counts_a_winner_per_layout_class_only_where_each_class_has_two_sizes():
    """From S=512 up, multiples of 16 want TILE=64 and the other sizes 128 (30% apart); below,
    256 serves every size. Over B in {16, 32}, each class has two sizes in the top part: one
    sub-bucket holds all of S >= 512, served by class. Over one Dim the top part grows from
    the upper bound, whose class has one size: a class's winner would rest on it alone, so the
    class does not count and the sizes are split apart instead."""
    by_s = {16: "low", 17: "low", 64: "low", 65: "low", 512: "aligned", 513: "other",
            1023: "other", 1024: "aligned"}
    times = {"aligned": {64: 10, 128: 13, 256: 13}, "other": {64: 13, 128: 10, 256: 13},
             "low": {64: 13, 128: 13, 256: 10}}
    order = [cfg(64), cfg(128), cfg(256)]
    two = Workload({"X": Tensor((Dim("B", 16, 32, buckets=[32]),
                                 Dim("S", 1, 1024, buckets=[1024])), "float16")})
    [b] = buckets(two)
    rows = {f"B={x},S={y}": times[k] for x in (16, 32) for y, k in by_s.items()}
    rows["B=32,S=1024"] = rows.pop("B=32,S=1024")                     # the top last
    groups, why = _span(b, rows, classes=True).split(order, None, TieBand(2.0), limit=3)
    assert [(g.winner, g.point, g.worst_pct) for g in groups] == [
        (cfg(256), {"B": 32, "S": 65}, 0.0), (cfg(64), None, 0.0)] and why is None
    assert groups[-1].by_class == {"B:16,S:16": cfg(64), "B:16,S:n": cfg(128)}
    one = Workload({"X": Tensor((Dim("M", 1, 1024, buckets=[1024]),), "float16")})
    [b] = buckets(one)
    groups, _ = _span(b, {f"M={y}": times[k] for y, k in by_s.items()}, classes=True).split(
        order, None, TieBand(2.0), limit=3)
    assert [g.point for g in groups] == [{"M": 65}, {"M": 512}, {"M": 1023}, None]
    assert [g.winner for g in groups] == [cfg(256), cfg(64), cfg(128), cfg(64)]
    # 66..512 raced 512 alone: its unaligned sizes borrow the winner at the nearest raced ones
    # (513 and 1023), and 513..1023's multiples of 16 the one at 512 and 1024; the top serves
    # 1024 alone, no unaligned size, and 1..65 raced both classes
    assert [g.by_class for g in groups] == [{}, {"M:n": cfg(128)}, {"M:16": cfg(64)}, {}]


@pytest.mark.parametrize("seed", range(0, 80, 8))
def test_every_raced_size_is_served_by_the_part_that_chose_with_it(seed):
    """Random times on the sizes of random buckets over one to three Dims, with and without
    layout classes, at every split limit: the split points stay within what a record may hold,
    the bucket map reads them, and the runtime's first matching point sends every raced size
    to the part whose winner was chosen with it."""
    from ctbuild.bucket_map import MAX_POINTS, read_splits, split_for
    for rng in (random.Random(seed + k) for k in range(8)):
        his = [rng.choice([16, 64, 1024, 4096]) for _ in range(rng.choice([1, 2, 2, 3]))]
        w = Workload({"X": Tensor(tuple(Dim(n, 1, h, buckets=[h] if rng.random() < .6 else None)
                                        for n, h in zip("ABC", his)), "float16")})
        b = list(buckets(w))[-1]
        sizes = [*span_sizes(b), dict(b.sizes)]
        configs = [cfg(t) for t in (16, 32, 64, 128)]
        span = Span(b, sizes, [{c: Timing(c, rng.uniform(1, 1.6), 0.0, 5) for c in configs}
                               for _ in sizes],
                    classes=[layout_class(s) for s in sizes] if rng.random() < .5 else [])
        groups, _ = span.split(configs, None, TieBand(2.0), rng.choice([1, 2, 3, 4]))
        points = [g.point for g in groups[:-1]]
        assert groups[-1].point is None and len(points) <= MAX_POINTS
        splits = read_splits({"splits": [{"sizes": p} for p in points]}, b)
        assert sorted(i for g in groups for i in g.members) == list(range(len(sizes)))
        for g in groups:
            for i in g.members:
                served = split_for(splits, sizes[i])
                assert (served.sizes if served else None) == g.point, (his, sizes[i])
        low = b.lower_bounds()
        for _ in range(40):  # a part's layout classes hold every size the runtime maps to it
            size = {n: rng.randint(low[n], v) for n, v in b.sizes}
            served = split_for(splits, size)
            k = points.index(dict(served.sizes)) if served else len(groups) - 1
            assert layout_class(size) in span._holds(groups, k), (his, size)
