"""``ctbuild tune --verify``: re-measure recorded winners against their ties and finalists on
this GPU and report drift, rewriting nothing.

How a fleet checks a new GPU type, driver or node before trusting a cache built elsewhere: for
every kernel x workload with a record (this GPU's, else one of the same arch and toolchain from
another GPU model), the recorded winner and the configs it was chosen among run off again
(interleaved, `ctbuild.tune.race`) and the tie rule decides anew. A record *agrees* when the
recorded winner is still among the ties of the fastest; *drifted* names the new fastest and by
how much the recorded winner is slower.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ..arch import Arch
from ..records import TuningRecord, stored_tuning
from ..space import Config
from .choice import TieBand, choose
from .measuring import Benches
from .race import FINALS_BUDGET, RaceBudget, race
from .tuner import Device, record_key

if TYPE_CHECKING:
    from ctbuild.cache import Store

    from .session import Entry

#: The most configs a verification runs off per key (the winner first).
MAX_CONTENDERS = 6


def recorded_for(entry: Entry, store: Store, device: Device, fp: str) -> TuningRecord | None:
    """This GPU's record of ``entry``, else the newest of the same kernel, tuning key, arch and
    toolchain recorded on another GPU model."""
    own = stored_tuning(store, record_key(entry.kernel, entry.workload, device, fp))
    if own is not None:
        return own
    want_key = entry.kernel.tuning_key(entry.workload)
    found: list[TuningRecord] = []
    for _, raw in store.tuning_records():
        with contextlib.suppress(ValueError):
            rec = TuningRecord.from_json(raw)
            if (rec.kernel, rec.kernel_fp, rec.arch, rec.toolchain) == (
                    entry.kernel.name, entry.kernel.fingerprint, device.arch, fp) \
                    and rec.tuning_key == want_key and rec.config is not None:
                found.append(rec)
    return max(found, key=lambda r: r.tuned_at, default=None)


def contenders(rec: TuningRecord) -> list[dict[str, Any]]:
    """The recorded winner, then its ties, finalists and fastest screened candidates. A record
    comes from a shared cache: rows that are not ``{"config": {...}}`` are skipped."""
    def configs(section: Any, field: str) -> list[Any]:
        rows = section.get(field) if isinstance(section, dict) else section
        return [r.get("config") for r in rows if isinstance(r, dict)] \
            if isinstance(rows, list) else []
    pool = [rec.config, *configs(rec.choice, "ties"), *configs(rec.runoff, "finalists"),
            *configs(rec.candidates, "")]
    out: list[dict[str, Any]] = []
    for c in pool:
        if isinstance(c, dict) and c and c not in out:
            out.append(c)
    return out[:MAX_CONTENDERS]


def verify_entry(entry: Entry, store: Store, device: Device, fp: str, band: TieBand,
                 budget: RaceBudget = FINALS_BUDGET) -> dict[str, Any]:
    """One entry's verification summary (see the module doc); never writes the store."""
    rec = recorded_for(entry, store, device, fp)
    head = {"kernel": entry.kernel.name, "entry": entry.index}
    if rec is None or rec.config is None:
        return {**head, "status": "unrecorded", "note": "no tuning record to verify"}
    configs = [Config(c, entry.kernel.name) for c in contenders(rec)]
    winner = configs[0]
    bench = Benches(entry.kernel, store, fp, device).on_spec(entry.workload)
    result = race(configs, bench.sample, band, budget) \
        if len(configs) > 1 else None
    timings = {t.config: t for t in (result.timings if result else ())}
    out = {**head, "recorded": rec.config, "recorded_on": rec.gpu,
           "recorded_us": rec.mean_us, "failures": [
               {"config": c.to_json(), "error": why} for c, why in (result.failures if result
                                                                     else ())]}
    if winner not in timings:
        return {**out, "status": "unmeasured",
                "note": "the recorded winner could not be timed against another config"}
    order = list(entry.kernel.candidates(entry.workload, Arch(device.arch)).kept)
    choice = choose(list(timings.values()), order, None, band)
    slower = timings[winner].mean_us / choice.fastest.mean_us - 1
    agrees = winner in {t.config for t in choice.ties}
    return {**out, "status": "agrees" if agrees else "drifted",
            "fastest": choice.fastest.config.to_json(), "winner_us": timings[winner].mean_us,
            "winner_slower_pct": round(100 * slower, 3),
            "time_change_pct": None if not rec.mean_us else
            round(100 * (timings[winner].mean_us / rec.mean_us - 1), 3)}

