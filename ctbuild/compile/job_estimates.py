"""How long each planned compile will take, so the farm can start the longest ones first.

The best guess is what the cache already knows: the ``compile_seconds`` it recorded for an
earlier build of the same kernel, config and arch (any workload or kernel version: compile time
follows the tile shapes far more than the source details). Without one, a power of the job's
tile volume (the product of the power-of-two integer constants of 16 or more its signature
passes, each capped at `MAX_TILE_DIM`) stands in: tileiras' time grows about as volume^0.75
(0.13 s at 2^9, 0.3 s at 2^17, 6 s at 2^22 for the examples and the benchmark GEMMs). The
constants, not only the config: an attention kernel's head dimension is no config entry, yet
its tiles are that wide. Magnitudes matter as much as the order: the farm sizes its batches by
them, and two "0.5 s" guesses that are really 6 s each must not share a batch.

A guess can still be far off for a kernel whose cost hides elsewhere (loops, reductions). So,
for each kernel and arch with no record, its largest config is assumed as long as the build's
longest job: it starts among the first, and a kernel that is heavier than its tiles say does
not end up at the tail. And the estimator learns while the build runs: each compiled job of a
kernel without records rescales that kernel's guesses (per arch, else per kernel) by the
geometric mean of its measured/guessed ratios, and the farm re-ranks the jobs it has not handed
out yet.
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from ..records import CompileMeta, RecordFormatError

if TYPE_CHECKING:
    from ctbuild.cache import Store

#: The guess without a record: BASE + SCALE * tile_volume ** POWER seconds.
GUESS_BASE, GUESS_SCALE, GUESS_POWER = 0.1, 6.5e-5, 0.75
#: A learned scale that moves by more than this factor makes the farm re-rank.
RERANK_FACTOR = 1.25
#: Largest factor one constant adds to a tile volume (a row width of 8192 is no 8192-wide tile).
MAX_TILE_DIM = 1024


def _identity(kernel: str, arch: str, config: dict[str, Any]) -> str:
    return json.dumps([kernel, arch, config], sort_keys=True)


def tile_volume(job: dict[str, Any]) -> float:
    """The product of the job's power-of-two integer constants >= 16 (tile sizes), each at
    most `MAX_TILE_DIM`, at least 1; a job that lists no constants: its config's values."""
    values = job["constants"] if "constants" in job else job["config"].values()
    volume = 1.0
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 16 \
                and value & (value - 1) == 0:
            volume *= min(value, MAX_TILE_DIM)
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


def guess(job: dict[str, Any]) -> float:
    """Seconds a compile of ``job`` takes, from its tile volume alone (see the module)."""
    return GUESS_BASE + GUESS_SCALE * tile_volume(job) ** GUESS_POWER


class JobEstimator:
    """``estimate(job) -> seconds`` for planned jobs (dicts of `CompileJob.to_json`): the
    recorded seconds, else the `guess` times what this build has learned of the kernel."""

    def __init__(self, known: dict[str, float]) -> None:
        self.known = known
        self._logs: dict[tuple[str, ...], list[float]] = {}   # group -> log(measured/guess)
        self._scale: dict[tuple[str, ...], float] = {}
        self._scouts: dict[str, tuple[str, str]] = {}   # job key -> its (kernel, arch)
        self._longest = 0.0

    def plan(self, jobs: list[dict[str, Any]]) -> None:
        """Pick each unrecorded (kernel, arch)'s scout among the build's ``jobs``: its largest
        config, assumed as long as the longest job until that kernel's first result."""
        top: dict[tuple[str, str], tuple[float, str]] = {}
        self._scouts, self._longest = {}, 0.0
        for job in jobs:
            secs = self(job)
            self._longest = max(self._longest, secs)
            if _identity(job["kernel"], job["arch"], job["config"]) not in self.known:
                group = (job["kernel"], job["arch"])
                top[group] = max(top.get(group, (secs, job["key"])), (secs, job["key"]))
        self._scouts = {key: group for group, (_, key) in top.items()}

    def __call__(self, job: dict[str, Any]) -> float:
        hit = self.known.get(_identity(job["kernel"], job["arch"], job["config"]))
        if hit is not None:
            return hit
        kernel, arch = job["kernel"], job["arch"]
        scale = self._scale.get((kernel, arch), self._scale.get((kernel,)))
        if scale is None and job["key"] in self._scouts:
            return max(self._longest, guess(job))
        return guess(job) * (1.0 if scale is None else scale)

    def learn(self, job: dict[str, Any], seconds: float) -> bool:
        """Take a compiled job's seconds into its kernel's scale; True when a scale moved by
        more than `RERANK_FACTOR` (then the jobs not handed out yet should be re-ranked)."""
        if seconds <= 0 or _identity(job["kernel"], job["arch"], job["config"]) in self.known:
            return False
        ratio = math.log(seconds / guess(job))
        moved = False
        for group in ((job["kernel"], job["arch"]), (job["kernel"],)):
            logs = self._logs.setdefault(group, [])
            logs.append(ratio)
            new = math.exp(sum(logs) / len(logs))
            old = self._scale.get(group)
            self._scale[group] = new
            if old is None or max(new / old, old / new) > RERANK_FACTOR:
                moved = True
        return moved


def estimator(store: Store) -> JobEstimator:
    """The estimator of a build into ``store``: what it recorded, then guesses that learn."""
    return JobEstimator(recorded_seconds(store))
