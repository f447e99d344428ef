"""The race: candidates re-measured interleaved, round by round, the surely slower dropped.

Every measurement after cuTile's screening goes through `race`: the finalists at a key's own
size, and every candidate at the other sizes of a `Dim` bucket (`ctbuild.tune.span`).

A GPU's clock drifts by up to ~15% within seconds, so two candidates measured a second apart are
compared under different clocks. A race measures every candidate still in it once per round (a
few samples each, the order rotated every round) and compares them within each round: each
round's times are divided by that round's geometric mean, which cancels whatever the clock did
to the whole round. A candidate's time is the mean of its normalised times, scaled back to
microseconds; its CI comes from how much those normalised times vary between rounds.

Racing: a candidate stops being measured once it is surely slower than the fastest by more than
the tie band (its CI and the fastest's apart, beyond the band), or, after the first round, more
than `COARSE_FACTOR` slower (more than clock drift can explain). Its last time is kept. Rounds
go on until every candidate left is decided against the fastest (a sure tie or surely slower)
or the budget ends, so a size costs little more than its survivors' samples.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..space import Config
from .choice import TieBand, Timing

#: How many finalists at most a key's own size races.
MAX_FINALISTS = 6
#: Screened candidates within this many tie bands of the fastest are finalists.
FINALIST_BANDS = 3.0
#: After one round, a candidate this much slower than the fastest leaves the race.
COARSE_FACTOR = 1.3


@dataclass(frozen=True)
class RaceBudget:
    """How long a race may go on: rounds, samples per candidate and round, measured seconds."""
    min_rounds: int = 5
    max_rounds: int = 40
    samples_per_round: int = 3
    max_seconds: float = 4.0

    def to_json(self) -> dict[str, Any]:
        return {"min_rounds": self.min_rounds, "max_rounds": self.max_rounds,
                "samples_per_round": self.samples_per_round, "max_seconds": self.max_seconds}


#: The budget of a key's own size (the finalists).
FINALS_BUDGET = RaceBudget()
#: The budget of each other size of a bucket (many candidates, most dropped early).
SPAN_BUDGET = RaceBudget(min_rounds=3, max_rounds=15, max_seconds=1.0)


@dataclass(frozen=True)
class RaceResult:
    """Per candidate its `Timing` (the ones dropped: as when dropped); rounds run; why it
    stopped; the candidates dropped as surely slower; those whose sample raised."""
    timings: tuple[Timing, ...]
    rounds: int
    stopped: str
    failures: tuple[tuple[Config, str], ...] = ()
    dropped: tuple[Config, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "stopped": self.stopped,
                "finalists": [t.to_json() for t in self.timings]}


def finalists(screened: Sequence[Timing], band: TieBand, default: Config | None,
              limit: int = MAX_FINALISTS) -> list[Timing]:
    """The screened candidates worth a race at the key's own size: within `FINALIST_BANDS` tie
    bands of the fastest or with a CI reaching that far, the fastest ``limit`` of them; the
    default config too when it is within reach (it wins every tie it is in)."""
    if not screened:
        return []
    fastest = min(screened, key=lambda t: t.mean_us)
    reach = fastest.mean_us * (1 + FINALIST_BANDS * band.percent / 100) + fastest.ci_us
    near = sorted((t for t in screened if t.mean_us - t.ci_us <= reach), key=lambda t: t.mean_us)
    chosen = near[:limit]
    dflt = next((t for t in near if default is not None and t.config == default), None)
    if dflt is not None and dflt not in chosen:
        chosen[-1] = dflt
    return chosen


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (within 2% for df >= 2:
    a series in 1/df; exact enough for a CI half-width)."""
    if df <= 1:
        return 12.71
    return 1.96 + 2.37 / df + 2.8 / df ** 2


def round_timings(rounds: Sequence[dict[Config, float]]) -> list[Timing]:
    """Each candidate's drift-cancelled time over ``rounds`` (each round: config -> its median
    time in that round; every round holds the same configs)."""
    if not rounds:
        return []
    configs = list(rounds[0])
    means = [math.exp(statistics.fmean(math.log(r[c]) for c in configs)) for r in rounds]
    scale = math.exp(statistics.fmean(math.log(g) for g in means))
    out = []
    for cfg in configs:
        ratios = [r[cfg] / g for r, g in zip(rounds, means)]
        n = len(ratios)
        sd = statistics.stdev(ratios) if n > 1 else float("inf")
        ci = t_quantile(n - 1) * sd / math.sqrt(n) if n > 1 else float("inf")
        out.append(Timing(cfg, scale * statistics.fmean(ratios), scale * ci, n))
    return out


def surely_slower(t: Timing, fastest: Timing, band: TieBand) -> bool:
    """Whether ``t`` is beyond the band of ``fastest`` with the two CIs apart."""
    return t.mean_us - t.ci_us > (fastest.mean_us + fastest.ci_us) * band.factor


def decided(timings: Sequence[Timing], band: TieBand) -> bool:
    """Whether more rounds could change no tie decision: every candidate's CI lies inside the
    band of the fastest, or beyond it with the two CIs apart."""
    fastest = min(timings, key=lambda t: t.mean_us)
    low = (fastest.mean_us - fastest.ci_us) * band.factor
    return all(t is fastest or t.mean_us + t.ci_us <= low or surely_slower(t, fastest, band)
               for t in timings)


def race(configs: Sequence[Config], sample: Callable[[Config], float], band: TieBand,
         budget: RaceBudget = FINALS_BUDGET) -> RaceResult:
    """Measure ``configs`` interleaved, dropping the surely slower, until decided or out of
    budget. ``sample(cfg)`` times one launch (restoring in-place inputs first); a candidate
    whose sample raises leaves the race with its error."""
    live = list(configs)
    failures: list[tuple[Config, str]] = []
    rounds: list[dict[Config, float]] = []
    left: dict[Config, Timing] = {}
    started = time.perf_counter()
    stopped = "budget: rounds"
    for r in range(budget.max_rounds):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        if r % 2:
            order.reverse()
        times: dict[Config, float] = {}
        for cfg in order:
            try:
                times[cfg] = statistics.median(sample(cfg)
                                               for _ in range(budget.samples_per_round))
            except Exception as exc:  # noqa: BLE001 - one candidate failing leaves the others
                failures.append((cfg, f"{type(exc).__name__}: {exc}"))
                live.remove(cfg)
                rounds = [{c: t for c, t in rd.items() if c != cfg} for rd in rounds]
        if len(live) < 2:
            stopped = "one candidate left"
            rounds.append({c: times[c] for c in live})
            break
        rounds.append({c: times[c] for c in live})
        timings = round_timings(rounds)
        drop = _dropped(timings, band, coarse=len(rounds) < budget.min_rounds)
        for t in drop:
            left[t.config] = t
            live.remove(t.config)
        rounds = [{c: rd[c] for c in live} for rd in rounds]
        if len(live) < 2:
            stopped = "one candidate left"
            break
        if len(rounds) >= budget.min_rounds and decided(round_timings(rounds), band):
            stopped = "decided"
            break
        if time.perf_counter() - started > budget.max_seconds:
            stopped = "budget: seconds"
            break
    kept = round_timings([rd for rd in rounds if rd]) if live else []
    return RaceResult(tuple(kept) + tuple(left.values()), len(rounds), stopped,
                      tuple(failures), tuple(left))


def _dropped(timings: Sequence[Timing], band: TieBand, coarse: bool) -> list[Timing]:
    """The candidates to stop measuring: surely slower than the fastest beyond the band, or
    (``coarse``: too few rounds for a CI) `COARSE_FACTOR` slower."""
    fastest = min(timings, key=lambda t: t.mean_us)
    if coarse:  # one round has no CI: the gap itself is the evidence
        return [dataclasses.replace(t, ci_us=0.0) for t in timings
                if t.mean_us > fastest.mean_us * COARSE_FACTOR]
    return [t for t in timings if t is not fastest and surely_slower(t, fastest, band)]
