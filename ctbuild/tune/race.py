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
than `COARSE_FACTOR` slower (more than a round's drift and noise can explain). Its last time is
kept. Rounds go on until every candidate left is decided against the fastest (a sure tie or
surely slower), or (a bucket's other sizes) timed precisely enough, or the budget ends, so a
size costs little more than its survivors' samples.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

from ..space import Config
from .choice import TieBand, Timing

#: How many finalists at most a key's own size races.
MAX_FINALISTS = 6
#: Screened candidates within this many tie bands of the fastest are finalists.
FINALIST_BANDS = 3.0
#: After the first round, a candidate this much slower than the fastest leaves the race.
COARSE_FACTOR = 1.25


class ContextLost(RuntimeError):
    """A launch broke this process's CUDA context: nothing more can be measured in it. Not a
    candidate's failure: every launch after it fails too, and the race must stop at once, the
    culprit told last (`ctbuild.tune.measuring.Bench`), so that the supervisor restarts the
    measuring process without it (`ctbuild.tune.supervisor`)."""


@dataclass(frozen=True)
class RaceBudget:
    """How long a race may go on: rounds, samples per candidate and round, measured seconds;
    ``precision_pct``: also stop once every candidate left is timed to within that percent of
    the fastest, or to within ``floor_us`` (a few-microsecond kernel's launch jitter is a
    larger share of it than the percent; None: only a decision stops it)."""
    min_rounds: int = 5
    max_rounds: int = 40
    samples_per_round: int = 3
    max_seconds: float = 4.0
    precision_pct: float | None = None
    floor_us: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The budget of a key's own size (the finalists): until every tie is decided.
FINALS_BUDGET = RaceBudget()
#: The budget of each other size of a bucket (many candidates, most dropped early): a loss
#: known to within half the default band (or 0.05 us) is what the bucket's choice needs there.
#: (One sample a candidate in the first round instead of a median of three dropped candidates
#: on one slow sample: 10x losses recorded, `benchmarks/tune_reproducibility.py`.)
SPAN_BUDGET = RaceBudget(min_rounds=3, max_rounds=15, max_seconds=1.0, precision_pct=1.0,
                         floor_us=0.05)


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


def round_timings(rounds: Sequence[dict[Config, float]],
                  reference: Sequence[Config] | None = None,
                  only: Collection[Config] | None = None) -> list[Timing]:
    """Each candidate's drift-cancelled time over ``rounds`` (each round: config -> its median
    time in that round). Every round is divided by the geometric mean of the ``reference``
    configs (default: those in every round), which every round holds: so a candidate dropped
    after a few rounds is on the same clock as those measured to the end. ``only``: the
    candidates to time (default: every one); the race asks for its live ones every round."""
    if not rounds:
        return []
    ref = list(reference) if reference is not None else \
        [c for c in rounds[0] if all(c in r for r in rounds)]
    means = [math.exp(_mean([math.log(r[c]) for c in ref])) for r in rounds]
    scale = math.exp(_mean([math.log(g) for g in means]))
    out = []
    for cfg in dict.fromkeys(c for r in rounds for c in r):
        if only is not None and cfg not in only:
            continue
        ratios = [r[cfg] / g for r, g in zip(rounds, means) if cfg in r]
        n, mean = len(ratios), _mean(ratios)
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in ratios) / (n - 1)) if n > 1 else 0.0
        ci = t_quantile(n - 1) * sd / math.sqrt(n) if n > 1 else float("inf")
        out.append(Timing(cfg, scale * mean, scale * ci, n))
    return out


def _mean(values: Sequence[float]) -> float:
    """The mean, in floats: `race` asks for thousands of them a tune, and `statistics`'
    exact arithmetic cost a quarter of a bucket's race."""
    return math.fsum(values) / len(values)


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


def precise(timings: Sequence[Timing], pct: float | None, floor_us: float = 0.0) -> bool:
    """Whether every candidate's CI is within ``pct`` percent of the fastest mean, or within
    ``floor_us``."""
    if pct is None:
        return False
    fastest = min(t.mean_us for t in timings)
    return all(t.ci_us <= max(fastest * pct / 100, floor_us) for t in timings)


def race(configs: Sequence[Config], sample: Callable[[Config], float], band: TieBand,
         budget: RaceBudget = FINALS_BUDGET) -> RaceResult:
    """Measure ``configs`` interleaved, dropping the surely slower, until decided or out of
    budget. ``sample(cfg)`` times one launch (restoring in-place inputs first); a candidate
    whose sample raises leaves the race with its error."""
    live = list(configs)
    failures: list[tuple[Config, str]] = []
    rounds: list[dict[Config, float]] = []
    dropped: list[Config] = []
    started = time.perf_counter()
    stopped = "budget: rounds"
    for r in range(budget.max_rounds):
        before = len(failures)
        times = _round(live, r, sample, budget.samples_per_round, failures)
        if len(failures) > before:  # a failed candidate leaves every round, not just this one
            kept = set(times) | set(dropped)
            rounds = [{c: t for c, t in rd.items() if c in kept} for rd in rounds]
        if times:
            rounds.append(times)
        if len(live) < 2:
            stopped = "one candidate left"
            break
        now = round_timings(rounds, live, set(live))
        out = [t.config for t in _dropped(now, band, coarse=len(rounds) == 1)]
        if out:
            dropped += out
            gone = set(out)
            live = [c for c in live if c not in gone]
            if len(live) < 2:
                stopped = "one candidate left"
                break
            now = round_timings(rounds, live, set(live))  # on the clock of those left
        if len(rounds) >= budget.min_rounds and decided(now, band):
            stopped = "decided"
            break
        if len(rounds) >= budget.min_rounds and precise(now, budget.precision_pct, budget.floor_us):
            stopped = "precise"
            break
        if time.perf_counter() - started > budget.max_seconds:
            stopped = "budget: seconds"
            break
    timings = round_timings(rounds, live) if live else []
    return RaceResult(tuple(_finite(t) for t in timings), len(rounds), stopped,
                      tuple(failures), tuple(dropped))


def _round(live: list[Config], r: int, sample: Callable[[Config], float], samples: int,
           failures: list[tuple[Config, str]]) -> dict[Config, float]:
    """Round ``r``: each live candidate's median of ``samples`` launches (in the first round
    after one untimed launch), the order rotated (and reversed every other round); a
    candidate whose sample raises leaves ``live``, its error in ``failures``."""
    order = live[r % len(live):] + live[:r % len(live)] if live else []
    if r % 2:
        order.reverse()
    times: dict[Config, float] = {}
    for cfg in order:
        try:
            if r == 0:
                sample(cfg)  # untimed: a first launch at a new size loads its CUBIN
            times[cfg] = statistics.median(sample(cfg) for _ in range(samples))
        except ContextLost:
            raise
        except Exception as exc:  # noqa: BLE001 - one candidate failing leaves the others
            failures.append((cfg, f"{type(exc).__name__}: {exc}"))
            live.remove(cfg)
    return times


def _finite(t: Timing) -> Timing:
    """A candidate timed in one round only has no CI: 0 (it left on a gap no drift explains,
    or it is alone), never infinite (a tie rule would read it as overlapping everything)."""
    return t if math.isfinite(t.ci_us) else dataclasses.replace(t, ci_us=0.0)


def _dropped(timings: Sequence[Timing], band: TieBand, coarse: bool) -> list[Timing]:
    """The candidates to stop measuring: surely slower than the fastest beyond the band, or
    (``coarse``: too few rounds for a CI) `COARSE_FACTOR` slower."""
    fastest = min(timings, key=lambda t: t.mean_us)
    if coarse:  # one round has no CI: the gap itself is the evidence
        return [t for t in timings if t.mean_us > fastest.mean_us * COARSE_FACTOR]
    return [t for t in timings if t is not fastest and surely_slower(t, fastest, band)]
