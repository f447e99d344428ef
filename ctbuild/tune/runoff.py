"""The runoff: finalists re-measured interleaved, round by round, until they separate.

cuTile's ``exhaustive_search`` measures each candidate to convergence one after another. A GPU's
clock drifts by up to ~15% within seconds, so two candidates measured a second apart are
compared under different clocks, and near-equal candidates swap places from one tune to the
next. The runoff measures every finalist once per round (a few samples each, the order rotated
every round) and compares them within each round: each round's times are divided by that
round's geometric mean, which cancels whatever the clock did to the whole round. A finalist's
time is the mean of its normalised times, scaled back to microseconds; its CI comes from how
much those normalised times vary between rounds.

Rounds continue until every finalist is decided against the fastest (its whole CI inside the
tie band: a sure tie; or beyond the band with the CIs apart: surely slower) or the budget ends.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..space import Config
from .choice import TieBand, Timing

#: How many finalists at most a key's runoff measures.
MAX_FINALISTS = 6
#: Screened candidates within this many tie bands of the fastest are finalists.
FINALIST_BANDS = 3.0


@dataclass(frozen=True)
class RunoffBudget:
    """How long a runoff may go on: rounds, samples per finalist and round, measured seconds."""
    min_rounds: int = 5
    max_rounds: int = 40
    samples_per_round: int = 3
    max_seconds: float = 4.0

    def to_json(self) -> dict[str, Any]:
        return {"min_rounds": self.min_rounds, "max_rounds": self.max_rounds,
                "samples_per_round": self.samples_per_round, "max_seconds": self.max_seconds}


@dataclass(frozen=True)
class RunoffResult:
    """Per finalist its runoff `Timing`; rounds run; why it stopped; finalists that failed."""
    timings: tuple[Timing, ...]
    rounds: int
    stopped: str
    failures: tuple[tuple[Config, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "stopped": self.stopped,
                "finalists": [t.to_json() for t in self.timings]}


def finalists(screened: Sequence[Timing], band: TieBand, default: Config | None,
              limit: int = MAX_FINALISTS) -> list[Timing]:
    """The screened candidates worth a runoff: within `FINALIST_BANDS` tie bands of the fastest
    or with a CI reaching that far, the fastest ``limit`` of them; the default config too when it
    is within reach (it wins every tie it is in)."""
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
    """Each finalist's drift-cancelled time over ``rounds`` (each round: config -> its median
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


def decided(timings: Sequence[Timing], band: TieBand) -> bool:
    """Whether more rounds could change no tie decision: every finalist's CI lies inside the band
    of the fastest, or beyond it with the two CIs apart."""
    fastest = min(timings, key=lambda t: t.mean_us)
    low = (fastest.mean_us - fastest.ci_us) * band.factor
    high = (fastest.mean_us + fastest.ci_us) * band.factor
    for t in timings:
        if t is fastest:
            continue
        sure_tie = t.mean_us + t.ci_us <= low
        sure_slower = t.mean_us - t.ci_us > high
        if not (sure_tie or sure_slower):
            return False
    return True


def runoff(configs: Sequence[Config], sample: Callable[[Config], float], band: TieBand,
           budget: RunoffBudget = RunoffBudget()) -> RunoffResult:
    """Measure ``configs`` interleaved until decided or out of budget. ``sample(cfg)`` times one
    launch (restoring in-place inputs first); a finalist whose sample raises leaves the runoff
    with its error."""
    live = list(configs)
    failures: list[tuple[Config, str]] = []
    rounds: list[dict[Config, float]] = []
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
            except Exception as exc:  # noqa: BLE001 - one finalist failing leaves the others
                failures.append((cfg, f"runoff: {type(exc).__name__}: {exc}"))
                live.remove(cfg)
                rounds = [{c: t for c, t in rd.items() if c != cfg} for rd in rounds]
        if len(live) < 2:
            stopped = "one finalist left"
            break
        rounds.append({c: times[c] for c in live})
        if len(rounds) >= budget.min_rounds and decided(round_timings(rounds), band):
            stopped = "decided"
            break
        if time.perf_counter() - started > budget.max_seconds:
            stopped = "budget: seconds"
            break
    return RunoffResult(tuple(round_timings(rounds)), len(rounds), stopped, tuple(failures))
