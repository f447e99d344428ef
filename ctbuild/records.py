"""The records ctbuild stores or exchanges, as typed dataclasses with a format version.

- `TuningRecord`: the winner of one kernel x workload on one GPU and toolchain (the cache's
  tuning entry), written by ``ctbuild tune`` and online tuning, read by the runtime.
- `CompileMeta`: the metadata of one cached CUBIN (what ``ctbuild cache ls/rm/export`` select
  on, what the farm's estimates and ``ctbuild tune`` read back).
- `MissRecord`: one line of a ``CTBUILD_RECORD`` file (a call the cache did not cover), read
  by ``ctbuild precompile --from-record``.

Stored form is JSON (never pickle). Each JSON object carries ``"format"``; a missing one is
format 1, read as records were always read, so existing caches stay readable. A newer format
than this ctbuild knows is refused on read (`RecordFormatError`) rather than half-understood;
readers treat it as a miss. Readers never pick fields of a record by string: they call
``from_json`` and use the attributes.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from pathlib import Path


log = logging.getLogger("ctbuild")

#: The format each record type writes; ``from_json`` reads this one and older.
TUNING_FORMAT = 1
COMPILE_META_FORMAT = 1
MISS_FORMAT = 1


class RecordFormatError(ValueError):
    """A stored record is not one this ctbuild can read (newer format, wrong shape)."""


def _format_of(obj: Any, what: str, newest: int) -> int:
    if not isinstance(obj, dict):
        raise RecordFormatError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    version = obj.get("format", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= newest:
        raise RecordFormatError(f"{what}: format {version!r} is not one this ctbuild reads "
                                f"(1..{newest}); upgrade ctbuild or rebuild the cache")
    return version


def _fields(cls: type, obj: dict[str, Any], renames: dict[str, str] | None = None
            ) -> dict[str, Any]:
    """The dataclass's fields found in ``obj`` (JSON names through ``renames``); others are
    ignored so that a newer writer's extra keys do not break an older reader of the same
    format."""
    renames = renames or {}
    out = {}
    for f in dataclasses.fields(cls):
        name = renames.get(f.name, f.name)
        if f.name != "format" and name in obj:
            out[f.name] = obj[name]
    return out


@dataclass
class TuningRecord:
    """The winner of one kernel x workload on one GPU (``config`` None: nothing measured).

    Only ``kernel`` is required on read: serving needs just the winner's ``config`` (the record
    key already pins kernel, tuning key, GPU and toolchain), and a record written by hand or by
    an older tool with fewer fields is still served."""
    kernel: str
    module: str = ""
    kernel_fp: str = ""
    arch: str = ""
    gpu: str = ""
    toolchain: str = ""
    tuning_key: Any = None
    workload: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    driver: str = "unknown"
    compile_key: str | None = None
    mean_us: float | None = None
    ci_us: float | None = None
    #: {"config", "mean_us", "ci_us"} of the kernel's default config
    default: dict[str, Any] = field(default_factory=dict)
    #: [{"config", "mean_us", "ci_us", "samples"}], fastest first
    candidates: list[dict[str, Any]] = field(default_factory=list)
    #: [{"config", "error"}]
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: {"total", "pruned", "kept"}
    space: dict[str, int] = field(default_factory=dict)
    #: how the winner was chosen: {"rule", "band", "fastest", "ties": [{"config", "mean_us",
    #: "ci_us", "samples"}] in space order} (`ctbuild.tune.choice`); None in older records
    choice: dict[str, Any] | None = None
    #: the finalists' interleaved re-measurement: {"rounds", "stopped", "budget", "finalists"}
    runoff: dict[str, Any] | None = None
    #: a Dim bucket's winner at the sizes it serves: {"bucket", "lower", "sizes", "max_pct",
    #: "worst_pct", "unsplit" (why not split further, None), "problems"} (`ctbuild.tune.span`)
    regret: dict[str, Any] | None = None
    #: a declared Dim bucket split by ``ctbuild tune``: {"format", "max_splits",
    #: "splits": [{"sizes", "regret_pct"}]} (`ctbuild.bucket_map`), read defensively
    refined: dict[str, Any] | None = None
    #: where a Dim bucket's sizes of another layout class want another winner (a size divisible
    #: by 16 runs another CUBIN than one that is not, `ctbuild.bucket_map.layout_class`):
    #: {class: {"config"}}; the runtime serves a call with its class's entry, else ``config``
    by_class: dict[str, Any] | None = None
    #: the correctness gate (`ctbuild.tune.check`): {"reference": "default" | "check=" | None,
    #: "failed": candidates with a wrong result, "note": why there was no reference}
    check: dict[str, Any] | None = None
    #: tuned on several GPUs (``ctbuild tune --gpus``): {"gpus", "per_gpu": [[timings]]}; the
    #: winner is then the tie rule's on the median time across GPUs
    fleet: dict[str, Any] | None = None
    compiled_during_tune: int = 0
    compiles_during_measurement: int = 0
    measure_seconds: float | None = None
    seconds: float | None = None
    #: measuring time by phase: {"screen", "check", "runoff", "span"} seconds
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: "workload" (declared or recorded specs) or "online" (the caller's tensors)
    source: str = "workload"
    tuned_at: str = ""
    #: set by the store when the record is written (seconds since the epoch)
    created: float | None = None
    format: int = TUNING_FORMAT

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return {"format": out.pop("format"), **out}

    @classmethod
    def from_json(cls, obj: Any) -> TuningRecord:
        """Read a stored record; `RecordFormatError` if it is not one this ctbuild reads (a
        record from a shared cache whose winner is not a JSON object is not one)."""
        version = _format_of(obj, "tuning record", TUNING_FORMAT)
        try:
            record = cls(**_fields(cls, obj), format=version)
        except TypeError as exc:  # a required field is missing
            raise RecordFormatError(f"tuning record: {exc}") from None
        if record.config is not None and not isinstance(record.config, dict):
            raise RecordFormatError(f"tuning record: its config is a "
                                    f"{type(record.config).__name__}, not a JSON object")
        return record

    @property
    def default_config(self) -> dict[str, Any] | None:
        return self.default.get("config")

    @property
    def default_mean_us(self) -> float | None:
        return self.default.get("mean_us")

    @property
    def speedup_vs_default(self) -> float | None:
        """Default config's mean time over the winner's (None when either is unknown)."""
        base = self.default_mean_us
        return base / self.mean_us if base and self.mean_us else None


@dataclass
class CompileMeta:
    """What a cached CUBIN was built from. Fields other than the kernel's are optional: a
    CUBIN the runtime JIT-compiled and wrote back records fewer (``source="runtime-jit"``)."""
    kernel: str
    module: str | None = None
    kernel_fp: str | None = None
    arch: str | None = None
    config: dict[str, Any] | None = None
    workload: dict[str, Any] | None = None
    toolchain: str | None = None
    compile_seconds: float | None = None
    #: digest of the anonymized TileIR bytecode the CUBIN was built from
    tileir: str | None = None
    #: how ``tileir`` was derived (`ctbuild.tileir.TILEIR_FORMAT`); None with a digest: 1
    tileir_format: int | None = None
    #: the signature class: "exact", "relaxed" or "generic" (JSON key "class")
    cls: str | None = None
    #: the `Weakening` (JSON) the signature was built under; None: exact
    weaken: Any = None
    #: who wrote it when not a build ("runtime-jit")
    source: str | None = None
    #: set by the store when the entry is written (seconds since the epoch)
    created: float | None = None
    format: int = COMPILE_META_FORMAT

    _RENAMES: ClassVar[dict[str, str]] = {"cls": "class"}

    def to_json(self) -> dict[str, Any]:
        """The entry's ``meta``: unset optional fields are left out."""
        out: dict[str, Any] = {"format": self.format}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "format" and value is not None:
                out[self._RENAMES.get(f.name, f.name)] = value
        return out

    @classmethod
    def from_json(cls, obj: Any) -> CompileMeta:
        """Read an entry's ``meta``; `RecordFormatError` if it is not one this ctbuild reads."""
        version = _format_of(obj, "compile metadata", COMPILE_META_FORMAT)
        found = _fields(cls, obj, cls._RENAMES)
        if not isinstance(found.get("kernel"), str):
            raise RecordFormatError("compile metadata: no kernel name")
        return cls(**found, format=version)

    @property
    def tileir_digest(self) -> tuple[str | None, int]:
        """(recorded TileIR digest or None, its format): entries written before the format was
        recorded used format 1."""
        fmt = self.tileir_format if isinstance(self.tileir_format, int) else 1
        return (self.tileir if isinstance(self.tileir, str) and self.tileir else None), fmt

    @property
    def signature_class(self) -> str:
        """The signature class; entries written before classes existed are exact."""
        return self.cls or "exact"


@dataclass
class MissRecord:
    """One call the cache did not cover: a line of a ``CTBUILD_RECORD`` file."""
    kernel: str
    workload: dict[str, Any]
    arch: str | None = None
    format: int = MISS_FORMAT

    def to_json(self) -> dict[str, Any]:
        """The line's object (format 1 is written without ``"format"``, as it always was)."""
        out: dict[str, Any] = {"kernel": self.kernel, "workload": self.workload,
                               "arch": self.arch}
        return out if self.format == 1 else {"format": self.format, **out}

    @classmethod
    def from_json(cls, obj: Any) -> MissRecord:
        """Read one line's object; `RecordFormatError` says what is wrong with it."""
        if not isinstance(obj, dict) or not isinstance(obj.get("kernel"), str) \
                or not isinstance(obj.get("workload"), dict):
            raise RecordFormatError("expected an object with \"kernel\" (str), \"workload\" "
                                    "(object) and \"arch\"")
        version = _format_of(obj, "miss record", MISS_FORMAT)
        return cls(obj["kernel"], obj["workload"], obj.get("arch"), format=version)


class TuningSource(Protocol):
    """What reading a tuning record needs of a cache (`ctbuild.cache.Store` and the serve phase's
    `KernelStore` both are one)."""

    @property
    def path(self) -> Path: ...

    def get_tuning(self, key: str) -> dict[str, Any] | None: ...


def stored_tuning(store: TuningSource, key: str) -> TuningRecord | None:
    """The tuning record under ``key``, or None when there is none or it is not one this ctbuild
    reads (a miss, logged, like every storage error)."""
    raw = store.get_tuning(key)
    if raw is None:
        return None
    try:
        return TuningRecord.from_json(raw)
    except RecordFormatError as exc:
        log.warning("ctbuild: tuning record %s in %s unreadable (%s); treating it as a miss",
                    key, store.path, exc)
        return None
