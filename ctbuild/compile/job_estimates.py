"""How long each planned compile will take, so the farm can start the longest ones first.

The best guess is what the cache already knows: the ``compile_seconds`` it recorded for an
earlier build of the same kernel, config and arch (any workload or kernel version: compile time
follows the tile shapes far more than the source details). A kernel with no record yet is
guessed from the size of its TileIR and its tile volume (the product of the power-of-two
integer constants of 16 or more its signature passes, each capped at `MAX_TILE_DIM`):

    seconds = TileIR KiB * (IR_BASE + IR_VOLUME * (tile_volume / 2**20) ** IR_POWER)

TileIR size counts what tileiras has to lower (ops, loops, gathers), about 0.26 s a KiB; the
tile volume how wide each op is, which matters from about 2**20 on (a 256x256x64 GEMM tile).
The TileIR comes from cuTile's front end, which ``plan`` and ``precompile`` run anyway before
anything compiles, once per class of jobs, to check the kernel bodies
(`ctbuild.compile.body_check`): the size costs nothing more, and it is nearly the same for
every config of a kernel (tile sizes are types, not ops: 2553-2743 bytes over attention's 39
configs). Without it (no toolchain) the guess is the tile volume alone:
BASE + SCALE * tile_volume ** POWER.

Measured on 2 cores (cuda-tile 1.7.0, tileiras 13.4, sm_90): 250 jobs of 16 kernels (the
examples, the benchmark's heavy kernels, the coverage fixture and, in TileGym's shapes, a paged
split-KV decode, a LayerNorm and an FP8 group quantisation). The front end takes 8-70 ms a job,
tileiras 0.11-7.7 s. Fitted weighting each job by its seconds (the long jobs make the sum and
the tail), and checked for each kernel with the constants fitted on the other 15 (a kernel
never seen):

    guess                  sum      per kernel    median job error  rank correlation
    tile volume alone      1.25x    0.08-2.8x     1.75x             0.83
    TileIR size x volume   1.00x    0.58-2.4x     1.29x             0.90

The paged decode, whose tiles are small (volume 2048) and whose TileIR is the largest
(5.8 KiB), is guessed 0.12 s by volume for 1.5 s measured, and 1.5 s by TileIR size. What
neither sees (a GEMM epilogue on 256x256 tiles at 0.6x, a LayerNorm whose row length is a
constant but no tile at 2.2x, an FP8 quantisation at 2.4x) the two mechanisms below catch.

For each kernel and arch with no record, its largest config is assumed about as long as the
build's longest job (`SCOUT_SHARE` of it, so the job guessed longest still goes out first): it
starts among the first, and a kernel that is heavier than guessed does not end up at the
tail. And the estimator learns while the build runs: each compiled job of a kernel
without records rescales that kernel's guesses (per arch, else per kernel) by the geometric
mean of its measured/guessed ratios, and the farm re-ranks the jobs it has not handed out yet.
A job still running counts before it ends (the farm tells each tick how long each has run):
its seconds so far are a lower bound on its own, so while they exceed its guess, elapsed/guess
joins its kernel's ratios (raising, never lowering, what the finished ones say) until its
result replaces it. A kernel whose first job runs 26 s where under 1 s was guessed thus sends
its other long configs to the next free workers, not after that first job ends: a first build
of a paged decode (two 26 s configs) among 1 s jobs on 15 workers started its second 26 s
config 12.5 s in and ended at 1.45x its floor; `benchmarks/first_build.py`'s simulated farm
ends such a build (175 jobs of about 1 s) at 1.46x its floor without this rule, 1.10x with it.
Magnitudes matter as much as the order: the farm sizes its batches by them, and two "0.5 s"
guesses that are really 6 s each must not share a batch.

``python benchmarks/first_build.py`` measures these figures again.
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Mapping

from ..records import CompileMeta, RecordFormatError

if TYPE_CHECKING:
    from ctbuild.cache import Store

#: The guess without a record: TileIR KiB * (IR_BASE + IR_VOLUME * (tile_volume / 2**20) **
#: IR_POWER) seconds (fitted to the measurements in the module's docstring) ...
IR_BASE, IR_VOLUME, IR_POWER = 0.26, 0.5, 1.5
#: ... and without the TileIR's size: BASE + SCALE * tile_volume ** POWER seconds.
GUESS_BASE, GUESS_SCALE, GUESS_POWER = 0.1, 6.5e-5, 0.75
#: An unrecorded kernel's largest config (its scout) is assumed this share of the longest guess.
SCOUT_SHARE = 0.99
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


def _number(value: Any) -> float | None:
    """``value`` where it is a finite number (a bool is none), else None: a shared cache's
    records are read, never trusted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        return None
    return float(value)


def recorded_seconds(store: Store) -> dict[str, float]:
    """(kernel, arch, config) -> the newest compile seconds recorded in ``store`` (a record
    whose seconds are not a positive finite number is skipped)."""
    newest: dict[str, tuple[float, float]] = {}
    for _, entry in store.compile_entries():
        try:
            meta = CompileMeta.from_json(entry)
        except RecordFormatError:
            continue
        secs, kernel, arch, config = _number(meta.compile_seconds), meta.kernel, meta.arch, \
            meta.config
        if secs is None or secs <= 0 or not isinstance(arch, str) \
                or not isinstance(config, dict):
            continue
        ident = _identity(kernel, arch, config)
        created = _number(meta.created) or 0.0
        if ident not in newest or created >= newest[ident][0]:
            newest[ident] = (created, secs)
    return {ident: secs for ident, (_, secs) in newest.items()}


def guess(job: dict[str, Any], tileir_bytes: int | None = None) -> float:
    """Seconds a compile of ``job`` takes, from the size of its kernel's TileIR and its tile
    volume, or from its tile volume alone where the size is unknown (see the module)."""
    if tileir_bytes is None:
        return GUESS_BASE + GUESS_SCALE * tile_volume(job) ** GUESS_POWER
    return tileir_bytes / 1024 * (IR_BASE + IR_VOLUME * (tile_volume(job) / 2 ** 20) ** IR_POWER)


class JobEstimator:
    """``estimate(job) -> seconds`` for planned jobs (dicts of `CompileJob.to_json`): the
    recorded seconds, else the `guess` times what this build has learned of the kernel.
    ``tileir_bytes``: (kernel, arch) -> its TileIR's size, as the body check found it."""

    def __init__(self, known: dict[str, float],
                 tileir_bytes: Mapping[tuple[str, str], int] | None = None) -> None:
        self.known = known
        self.tileir_bytes = dict(tileir_bytes or {})
        self._logs: dict[tuple[str, ...], list[float]] = {}   # group -> log(measured/guess)
        # group -> job key -> log(elapsed/guess) of a job not finished: a lower bound on its log
        self._bounds: dict[tuple[str, ...], dict[str, float]] = {}
        self._scale: dict[tuple[str, ...], float] = {}
        self._ranked: dict[tuple[str, ...], float] = {}   # the scale at its last re-rank
        self._scouts: dict[str, tuple[str, str]] = {}   # job key -> its (kernel, arch)
        self._longest = 0.0

    def plan(self, jobs: list[dict[str, Any]]) -> None:
        """Pick each unrecorded (kernel, arch)'s scout among the build's ``jobs``: its largest
        config, assumed about as long as the longest job until that kernel's first result."""
        top: dict[tuple[str, str], tuple[float, str]] = {}
        self._scouts, self._longest = {}, 0.0
        for job in jobs:
            secs = self(job)
            self._longest = max(self._longest, secs)
            if _identity(job["kernel"], job["arch"], job["config"]) not in self.known:
                group = (job["kernel"], job["arch"])
                top[group] = max(top.get(group, (secs, job["key"])), (secs, job["key"]))
        self._scouts = {key: group for group, (_, key) in top.items()}

    def guess(self, job: dict[str, Any]) -> float:
        """The `guess` for ``job``, with its kernel's TileIR size where the body check gave it."""
        return guess(job, self.tileir_bytes.get((job["kernel"], job["arch"])))

    def __call__(self, job: dict[str, Any]) -> float:
        hit = self.known.get(_identity(job["kernel"], job["arch"], job["config"]))
        if hit is not None:
            return hit
        kernel, arch = job["kernel"], job["arch"]
        scale = self._scale.get((kernel, arch), self._scale.get((kernel,)))
        if scale is None and job["key"] in self._scouts:
            return max(self._longest * SCOUT_SHARE, self.guess(job))
        return self.guess(job) * (1.0 if scale is None else scale)

    def learn(self, job: dict[str, Any], seconds: float) -> bool:
        """Take a compiled job's seconds into its kernel's scale (in place of what `running`
        said of it); True when a scale moved by more than `RERANK_FACTOR` since it last did
        (then the jobs not handed out yet should be re-ranked)."""
        if seconds <= 0 or _identity(job["kernel"], job["arch"], job["config"]) in self.known:
            return False
        ratio = math.log(seconds / self.guess(job))
        moved = False
        for group in self._groups(job):
            self._bounds.get(group, {}).pop(job["key"], None)
            self._logs.setdefault(group, []).append(ratio)
            moved = self._rescale(group) or moved
        return moved

    def running(self, job: dict[str, Any], elapsed: float) -> bool:
        """Take a job still running after ``elapsed`` seconds as a lower bound on its seconds:
        past its guess, it raises its kernel's scale (its other configs' estimates) to
        elapsed/guess while the kernel has no result, else toward it, so a kernel far slower
        than guessed is known before its first job ends. True as for `learn`; a bound below
        what the kernel's results say changes nothing."""
        if elapsed <= 0 or _identity(job["kernel"], job["arch"], job["config"]) in self.known:
            return False
        bound = math.log(elapsed / self.guess(job))
        moved = False
        for group in self._groups(job):
            bounds = self._bounds.setdefault(group, {})
            if bound > bounds.get(job["key"], -math.inf):
                bounds[job["key"]] = bound
                moved = self._rescale(group) or moved
        return moved

    @staticmethod
    def _groups(job: dict[str, Any]) -> tuple[tuple[str, ...], ...]:
        """What a job's seconds rescale: its kernel on its arch, and its kernel on any arch."""
        return (job["kernel"], job["arch"]), (job["kernel"],)

    def _rescale(self, group: tuple[str, ...]) -> bool:
        """The group's scale: the geometric mean of its finished jobs' ratios and of the lower
        bounds above them (without results: above the guess; a bound below says nothing). True
        when it moved by more than `RERANK_FACTOR` since it last did (or was first set)."""
        logs = self._logs.get(group, [])
        floor = sum(logs) / len(logs) if logs else 0.0
        ratios = logs + [b for b in self._bounds.get(group, {}).values() if b > floor]
        if not ratios:
            return False
        new = math.exp(sum(ratios) / len(ratios))
        self._scale[group] = new
        old = self._ranked.get(group)
        if old is not None and max(new / old, old / new) <= RERANK_FACTOR:
            return False
        self._ranked[group] = new
        return True


def estimator(store: Store, tileir_bytes: Mapping[tuple[str, str], int] | None = None
              ) -> JobEstimator:
    """The estimator of a build into ``store``: what it recorded, then guesses (from
    ``tileir_bytes`` where given) that learn."""
    return JobEstimator(recorded_seconds(store), tileir_bytes)
