"""The correctness gate: does a candidate compute what the default config computes (or what the
kernel's ``check=`` reference expects) on the same inputs?

A config can be fast because it computes the wrong thing (a tile that skips a remainder, a
split that drops a partial sum); timing alone would make it the winner everywhere. `OutputCheck`
holds one key's real inputs and answers, per config, None or a one-line "wrong result: ..."
that the tuner records as the candidate's failure.

* Every tensor argument is snapshotted once (the bytes under it) and restored before each
  launch, so every config starts from the same bytes, outputs a kernel only partly writes
  included. After the launch every tensor argument is compared (the ones a config writes are
  the ones that can differ; one that writes into an input is caught as well).
* Without ``check=`` the default config's launch is the reference. An argument the default
  left unchanged is its own snapshot, so the check holds at most two extra copies of the key's
  tensors (the snapshot and the default's outputs), in practice one plus the outputs. Values
  are compared a few million elements at a time, so the working memory beyond that is bounded.
* With ``check=``, ``check(w)`` runs once on the inputs (``reset_to_zero=`` arguments zeroed,
  as a launch sees them) and returns ``{argument: expected}``; only those arguments are
  compared, the default config's as well: a default that fails is the kernel's error.
* `TOLERANCES`: exact for integers and bools; for floats ``|got - expected| <= atol * scale +
  rtol * |expected|``, scale the largest finite ``|expected|`` of the argument, wide enough for
  another reduction order or tile shape; NaNs must sit where the reference has them, infinities
  must be equal.

A launch that raises is a verdict ("check: <ExcType>: message"), never an exception of the
check. Restores run on torch's current stream, which is synchronized before each launch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from ..space import Config
from ..specs import Workload, dtype_name
from .race import ContextLost

if TYPE_CHECKING:
    from ..declare import TunedKernel

#: (rtol, atol as a fraction of the reference's largest finite magnitude) per float dtype:
#: a few units in the last place of the dtype, so that configs summing in another order agree.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9), "float32": (1e-4, 1e-5), "float16": (5e-3, 5e-4),
    "bfloat16": (3e-2, 4e-3), "float8_e4m3fn": (0.13, 2e-2), "float8_e5m2": (0.26, 4e-2)}
#: Elements compared at once: bounds a comparison's temporaries (float64 copies, masks) to
#: about 0.3 GB.
CHUNK = 1 << 22


class OutputCheck:
    """One key's correctness gate (module doc). ``inputs``: the key's real tensors by argument
    name; ``launch(cfg)``: launches ``cfg`` once on them and synchronizes (restoring the
    declared ``restore=``/``reset_to_zero=`` arguments itself). Drop it to free its copies."""

    def __init__(self, tuned: TunedKernel, inputs: Workload,
                 launch: Callable[[Config], None]) -> None:
        self.tuned, self.inputs, self.launch = tuned, inputs, launch
        self.tensors = dict(_tensor_leaves(inputs))
        self.snapshot = {label: _span(t).clone() for label, t in self.tensors.items()}
        self.expected: dict[str, Any] | None = None

    def restore(self) -> None:
        """Every tensor argument back to the bytes it had when the check was made."""
        import torch
        for label, t in self.tensors.items():
            _span(t).copy_(self.snapshot[label])
        if any(t.is_cuda for t in self.tensors.values()):
            torch.cuda.current_stream().synchronize()

    def _run(self, cfg: Config) -> str | None:
        self.restore()
        try:
            self.launch(cfg)
        except ContextLost:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing launch is the candidate's verdict
            return f"check: {type(exc).__name__}: {exc}"
        return None

    def reference(self, default: Config) -> str | None:
        """Launch ``default`` and keep its outputs as the reference (with ``check=``: take the
        user's reference and check ``default`` against it). An error text when there is no
        usable reference or ``default`` fails the user's; else None."""
        if self.tuned.check is not None:
            if problem := self._user_reference(self.tuned.check):
                return problem
            if problem := self.verdict(default):
                return f"the default config {default!r} fails check=: {problem}"
            return None
        if problem := self._run(default):
            return f"the default config {default!r} cannot be the reference: {problem}"
        self.expected = {label: self._kept(label, t) for label, t in self.tensors.items()}
        return None

    def _kept(self, label: str, t: Any) -> Any:
        """The default's value of one argument: a view of the snapshot where the launch left
        the bytes unchanged (an input), else of a copy."""
        span = _span(t)
        same = _same_bytes(span, self.snapshot[label])
        base = self.snapshot[label] if same else span.clone()
        return base.as_strided(t.shape, t.stride(), 0)

    def _user_reference(self, check: Callable[[Workload], Any]) -> str | None:
        """``check(w)`` on the inputs as a launch sees them, validated into `expected`."""
        import torch
        self.restore()
        for name in self.tuned.reset_to_zero:
            self.inputs[name].zero_()
        try:
            expected = check(self.inputs)
        except Exception as exc:  # noqa: BLE001 - the user's function: its error, named
            return f"check= raised {type(exc).__name__}: {exc}"
        if not isinstance(expected, Mapping):
            return f"check= returned {type(expected).__name__}, not {{argument: expected}}"
        kept = {}
        for name, value in expected.items():
            t = self.tensors.get(name)
            if t is None:
                return (f"check= returned {name!r}, which is no tensor argument; tensor "
                        f"arguments: {', '.join(self.tensors)}")
            value = torch.as_tensor(value, device=t.device)
            if tuple(value.shape) != tuple(t.shape):
                return (f"check= returned {name!r} with shape {tuple(value.shape)}; the "
                        f"argument's is {tuple(t.shape)}")
            kept[name] = value
        self.expected = kept
        return None

    def verdict(self, cfg: Config) -> str | None:
        """Launch ``cfg`` on the inputs and compare: None when its outputs match the reference,
        else "wrong result: ..." (or "check: ..." when the launch raised)."""
        if self.expected is None:
            raise RuntimeError("OutputCheck.verdict before a reference (call reference first)")
        if problem := self._run(cfg):
            return problem
        for label, expected in self.expected.items():
            if problem := compare(label, self.tensors[label], expected):
                return problem
        return None


def _tensor_leaves(w: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(label, tensor) for every tensor argument, those inside tuples as ``name[i]``."""
    import torch

    def leaves(label: str, value: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(value, torch.Tensor):
            yield label, value
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                yield from leaves(f"{label}[{i}]", v)
    for name, value in w.items():
        yield from leaves(name, value)


def _span(t: Any) -> Any:
    """The memory under a tensor as one flat run of elements (strided gaps and broadcast
    dims included), so a copy restores bytes exactly, overlapping views too."""
    n = 0 if t.numel() == 0 else 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    return t.as_strided((n,), (1,), t.storage_offset())


def _same_bytes(a: Any, b: Any) -> bool:
    """Whether two flat runs of one dtype hold the same bytes (NaNs included), `CHUNK` bytes
    at a time so that the comparison's mask stays small."""
    import torch
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.view(torch.uint8), b.view(torch.uint8)
    return all(torch.equal(a[i:i + CHUNK], b[i:i + CHUNK]) for i in range(0, a.numel(), CHUNK))


def compare(label: str, got: Any, expected: Any) -> str | None:
    """None when ``got`` matches ``expected`` within the tolerance of ``got``'s dtype, else
    "wrong result: max abs diff X at label[i, j] (expected E, got G; n of N elements off)"."""
    if got.stride() == expected.stride() and _same_bytes(_span(got), _span(expected)):
        return None
    name = dtype_name(got.dtype)
    tol = TOLERANCES.get(name)
    scale = _scale(expected) if tol is not None else 0.0
    worst: tuple[float, tuple[int, ...], float, float] | None = None
    off = 0
    for offset, g, e in _pieces(got, expected):
        bad, score, g64, e64 = _mismatches(g, e, tol, scale)
        if n := int(bad.sum()):
            off += n
            i = int(score.flatten().argmax())
            if worst is None or float(score.flatten()[i]) > worst[0]:
                where = _at(offset, i, tuple(g.shape))
                worst = (float(score.flatten()[i]), where, float(e64.flatten()[i]),
                         float(g64.flatten()[i]))
    if worst is None:
        return None
    _, where, exp, val = worst
    at = f"{label}[{', '.join(map(str, where))}]" if where else label
    return (f"wrong result: max abs diff {_num(abs(val - exp))} at {at} (expected {_num(exp)}, "
            f"got {_num(val)}; {off} of {got.numel()} elements off)")


def _mismatches(g: Any, e: Any, tol: tuple[float, float] | None, scale: float
                ) -> tuple[Any, Any, Any, Any]:
    """(bad mask, badness score: 0 where fine, NaN/inf mismatches highest, the values as
    float64) for one piece."""
    import torch
    g64, e64 = g.to(torch.float64), e.to(torch.float64)
    if tol is None:  # integers and bools: exact
        bad = g.to(torch.int64) != e.to(torch.int64)
        diff = (g64 - e64).abs()
    else:
        rtol, atol = tol
        nan_g, nan_e = torch.isnan(g64), torch.isnan(e64)
        finite = torch.isfinite(g64) & torch.isfinite(e64)
        diff = (g64 - e64).abs()
        bad = (nan_g != nan_e) | (~finite & ~nan_g & ~nan_e & (g64 != e64)) | (
            finite & (diff > atol * scale + rtol * e64.abs()))
        diff = torch.where(finite, diff, torch.full_like(diff, float("inf")))
    return bad, torch.where(bad, diff, torch.zeros_like(diff)) + bad.to(torch.float64), g64, e64


def _scale(expected: Any) -> float:
    """The largest finite magnitude of the reference (1 when it is all zero or non-finite)."""
    import torch
    top = 0.0
    for _, _, e in _pieces(expected, expected):
        e64 = e.to(torch.float64).abs()
        e64 = torch.where(torch.isfinite(e64), e64, torch.zeros_like(e64))
        top = max(top, float(e64.max())) if e64.numel() else top
    return top or 1.0


def _pieces(got: Any, expected: Any, base: tuple[int, ...] = ()
            ) -> Iterator[tuple[tuple[int, ...], Any, Any]]:
    """Matching pieces of at most `CHUNK` elements (rows of dim 0, or single rows split
    further): (offset, got, expected); `_at` locates a piece's element in the whole tensor."""
    if got.ndim == 0 or got.numel() <= CHUNK:
        yield base + (0,) * got.ndim, got, expected
        return
    row = got[0].numel()
    if row > CHUNK:
        for i in range(got.shape[0]):
            yield from _pieces(got[i], expected[i], base + (i,))
        return
    rows = CHUNK // row
    for i in range(0, got.shape[0], rows):
        yield base + (i,) + (0,) * (got.ndim - 1), got[i:i + rows], expected[i:i + rows]


def _at(offset: tuple[int, ...], i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index in the whole tensor of a piece's ``i``-th element (row-major)."""
    u = []
    for n in reversed(shape):
        i, r = divmod(i, n)
        u.append(r)
    fixed = len(offset) - len(shape)
    return offset[:fixed] + tuple(o + x for o, x in zip(offset[fixed:], reversed(u)))


def _num(x: float) -> str:
    return f"{x:.6g}"
