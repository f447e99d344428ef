"""How long each planned compile will take, so the farm can start the longest ones first.

The best guess is what the cache already knows: the ``compile_seconds`` it recorded for an
earlier build of the same kernel, config and arch (any workload or kernel version: compile time
follows the tile shapes far more than the source details). Without one, the config's tile
volume (the product of its power-of-two entries of 16 or more) stands in, scaled so that a
recorded kernel's jobs and a new kernel's jobs rank together sensibly.
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Callable

from ..records import CompileMeta, RecordFormatError

if TYPE_CHECKING:
    from cache import Store

#: Seconds assumed per unit of log2(tile volume) when nothing is recorded.
SECONDS_PER_LOG2_VOLUME = 0.02


def _identity(kernel: str, arch: str, config: dict[str, Any]) -> str:
    return json.dumps([kernel, arch, config], sort_keys=True)


def tile_volume(config: dict[str, Any]) -> float:
    """The product of the config's power-of-two integers >= 16 (tile sizes), at least 1."""
    volume = 1.0
    for value in config.values():
        if isinstance(value, int) and not isinstance(value, bool) and value >= 16 \
                and value & (value - 1) == 0:
            volume *= value
    return volume


def recorded_seconds(store: Store) -> dict[str, float]:
    """(kernel, arch, config) -> the newest compile seconds recorded in ``store``."""
    newest: dict[str, tuple[float, float]] = {}
    for _, entry in store.compile_entries():
        try:
            meta = CompileMeta.from_json(entry)
        except RecordFormatError:
            continue
        secs, kernel, arch, config = meta.compile_seconds, meta.kernel, meta.arch, meta.config
        if not isinstance(secs, (int, float)) or not isinstance(arch, str) \
                or not isinstance(config, dict):
            continue
        ident = _identity(kernel, arch, config)
        created = float(meta.created or 0.0)
        if ident not in newest or created >= newest[ident][0]:
            newest[ident] = (created, float(secs))
    return {ident: secs for ident, (_, secs) in newest.items()}


def estimator(store: Store) -> Callable[[dict[str, Any]], float]:
    """``estimate(job) -> seconds`` for planned jobs (dicts of `CompileJob.to_json`)."""
    known = recorded_seconds(store)

    def estimate(job: dict[str, Any]) -> float:
        hit = known.get(_identity(job["kernel"], job["arch"], job["config"]))
        if hit is not None:
            return hit
        return 0.1 + SECONDS_PER_LOG2_VOLUME * math.log2(tile_volume(job["config"]))

    return estimate
