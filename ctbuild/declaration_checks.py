"""Checks of a declaration that a newcomer's typo would otherwise pass silently or fail late.

Each function returns a problem as one sentence (with a "did you mean" where a close name
exists), or None; `TunedKernel` and the planner prefix the kernel's name. They run at
declaration time (the shapes of the user's functions, the default, the key's bucket names) and
at plan time (what the grid and the axes do for real configs), so every declaration mistake ends
at ``ctbuild plan`` with exit 2, before anything is compiled.
"""
from __future__ import annotations

import difflib
import inspect
import typing
from typing import Any, Callable, Iterable, Mapping, Sequence

from .bucket_map import MAX_SPLITS
from .space import HINT_NAMES, TRITON_KNOBS, Config, Space
from .specs import Workload

#: CUDA's grid limits (blocks per dimension) on every arch tileiras targets; cuTile's launch
#: checks the device's own (`_get_max_grid_size`), which are these.
MAX_GRID = (2**31 - 1, 65535, 65535)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the closest of ``choices``, else ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def article(word: str) -> str:
    """``an int``, ``a dict``: a word (a type's name) with its article."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def given(value: Any) -> str:
    """A wrong argument as a message shows it: its type and its (shortened) value."""
    text = repr(value)
    return f"{article(type(value).__name__)} {text if len(text) <= 60 else text[:57] + '...'}"


def checked_names(what: str, value: Any, error: Callable[[str], Exception]) -> tuple[str, ...]:
    """``restore=``, ``reset_to_zero=``, ``params=``: argument names, a list or tuple of them;
    one name given as a str is that name (``tuple("OUT")`` would be its letters)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value):
        return tuple(value)
    raise error(f"{what}= must be an argument name or a tuple of them, got {given(value)}")


def checked_workloads(workloads: Any, error: Callable[[str], Exception]) -> list[Workload]:
    """``workloads=`` as `Workload` s: a list of dicts, one per call (a lone dict would be read
    as its argument names)."""
    if isinstance(workloads, (Mapping, str)) or not isinstance(workloads, Iterable):
        fix = "; put it in a list: workloads=[{...}]" if isinstance(workloads, Mapping) else ""
        raise error(f"workloads must be a list of dicts of call arguments, one per call, got "
                    f"{given(workloads)}{fix}")
    items = list(workloads)
    if bad := [w for w in items if not isinstance(w, Mapping)]:
        raise error(f"each workload must be a dict of call arguments, got {given(bad[0])}")
    return [w if isinstance(w, Workload) else Workload(dict(w)) for w in items]


def cap_problem(cap: Any) -> str | None:
    """A ``cap`` (``autotune(cap=)``, ctbuild.toml's ``cap``) that is not a whole number >= 1."""
    if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1:
        return None
    return (f"cap must be a whole number >= 1 (the most configs per kernel, workload and arch), "
            f"got {given(cap)}")


def _where(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    what = "the lambda" if fn.__name__ == "<lambda>" else f"{fn.__name__}()"
    return f"{what} at {code.co_filename}:{code.co_firstlineno}"


def arity_problem(what: str, fn: Any, counts: Sequence[int], shape: str) -> str | None:
    """Whether ``fn`` can be called with one of ``counts`` positional arguments (``shape``
    names them, e.g. "(cfg, w)"); a wrong lambda would otherwise fail as a bare TypeError."""
    if not callable(fn):
        return f"{what} must be a function {shape}, got {fn!r}"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if any(len(required) <= n <= len(positional) for n in counts):
        return None
    names = ", ".join(p.name for p in positional) or "nothing"
    return (f"{what} must take {shape}, but {_where(fn)} takes {len(positional)} "
            f"parameter{'s' if len(positional) != 1 else ''} ({names})")


def default_problem(default: Any, space: Space) -> str | None:
    """Why a declared default config is not in the space: a misspelt axis, a missing axis, a
    value the axis does not have, or a combination the space does not hold; or no dict at all
    (``default="TT=16"``)."""
    configs = space.enumerate()
    if not isinstance(default, Mapping):
        return (f"default must be a dict of axis values (or a function default(w) returning "
                f"one), got {given(default)}; e.g. default={configs[0]}")
    if any(Config(c) == Config(default) for c in configs):
        return None
    axes = space.axes()
    for name in default:
        if name not in axes:
            return (f"default names axis {name!r}, which the space does not have"
                    f"{did_you_mean(name, axes)}; axes: {', '.join(axes)}")
    missing = [a for a in axes if a not in default and all(a in c for c in configs)]
    if missing:
        return f"default gives no value for axis {missing[0]!r}; axes: {', '.join(axes)}"
    for name, value in default.items():
        values = [c[name] for c in configs if name in c]
        if value not in values:
            shown = ", ".join(map(repr, dict.fromkeys(values)))
            return f"default {name}={value!r} is not one of that axis's values ({shown})"
    return (f"default config {Config(default)!r} is not in the search space (each value is, "
            "this combination is not)")


def int_axis_problem(fn: Callable[..., Any], space: Space) -> str | None:
    """An axis whose kernel parameter is annotated int (``TILE: ct.Constant[int]``) given a
    value that is not one (``TILE=[8.0, 16.0]``): the plan would blame the grid it makes
    (``grid (64.0,)``). Other axes take any value (``ct.Constant[float]``, a grid-only knob)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # an annotation that does not evaluate here: nothing to check
        return None
    ints = [name for name, hint in hints.items() if typing.get_origin(hint) is typing.Annotated
            and typing.get_args(hint)[0] is int]
    for cfg in space.enumerate() if ints else ():
        for name in ints:
            if name in cfg and not isinstance(cfg[name], int):
                value = cfg[name]
                return (f"axis {name!r} has the value {value!r} ({article(type(value).__name__)}),"
                        f" but the kernel parameter {name} is an int ({name}: "
                        "ct.Constant[int]); give the axis int values")
    return None


def bucket_problem(key_fn: Any, params: Sequence[str], first: Mapping[str, Any] | None
                   ) -> str | None:
    """A ``key=ctbuild.key(bucket={...})`` naming an argument or a dim that does not exist."""
    bucket = getattr(key_fn, "__dict__", {}).get("ctbuild_bucket") or {}
    for name, dims in bucket.items():
        if name not in params:
            return (f"key= buckets {name!r}, which is no call argument"
                    f"{did_you_mean(str(name), params)}; call arguments: {', '.join(params)}")
        value = (first or {}).get(name)
        ndim = getattr(value, "ndim", None)
        if ndim is None and first is not None:
            return f"key= buckets {name!r}, which is no tensor in the workloads"
        bad = [d for d in dims if not isinstance(d, int) or ndim is not None
               and not -ndim <= d < ndim]
        if bad:
            return (f"key= buckets dim {bad[0]!r} of {name!r}, which has {ndim} dims "
                    "(give dim indices 0..ndim-1)")
    return None


def grid_problem(grid: Any) -> str | None:
    """A grid cuTile cannot launch: not 1 to 3 whole numbers within CUDA's limits."""
    if len(grid) == 0 or len(grid) > 3:
        return (f"grid {grid} has {len(grid)} dimensions; cuTile launches 1 to 3 "
                "(fold the others into one, e.g. (B * H, M))")
    for axis, (n, limit) in enumerate(zip(grid, MAX_GRID)):
        if isinstance(n, bool) or not isinstance(n, int):
            return (f"grid {grid}: dimension {axis} is {n!r}, not an int "
                    "(use ct.cdiv(n, tile) or //, not /)")
        if n < 1:
            return f"grid {grid}: dimension {axis} is {n}; every dimension needs >= 1 block"
        if n > limit:
            return (f"grid {grid}: dimension {axis} has {n:.3g} blocks, above CUDA's limit "
                    f"{limit}; lower the Dim's hi or the sizes, or loop over blocks in the "
                    "kernel (a persistent grid)")
    return None


def index_problem(params: Sequence[str], args: Sequence[Any], signature: Any) -> str | None:
    """A tensor whose sizes or strides exceed the int32 index cuTile uses unless the parameter
    is annotated ``ct.IndexedWithInt64`` (the launch would refuse it)."""
    import cuda.tile as ct

    from .specs import Tensor
    for name, value, constraint in zip(params, args, getattr(signature, "parameters", ())):
        if not isinstance(value, Tensor) or getattr(constraint, "index_dtype", None) != ct.int32:
            continue
        big = max([*value.shape, *(abs(s) for s in value.strides or ())], default=0)
        if big > 2**31 - 1:
            return (f"{name} has a size or stride of {big}, beyond cuTile's int32 index range; "
                    f"annotate the parameter {name} with ct.IndexedWithInt64, or lower the "
                    "Dim's hi")
    return None


class ReadLog(Config):
    """A config that notes which axes its readers asked for (iterating reads them all)."""

    __slots__ = ("reads",)

    def __init__(self, cfg: Config, owner: str = "") -> None:
        super().__init__(cfg, owner)
        object.__setattr__(self, "reads", set())

    def __getattr__(self, name: str) -> Any:
        self.reads.add(name)
        return super().__getattr__(name)

    def __getitem__(self, name: str) -> Any:
        self.reads.add(name)
        return super().__getitem__(name)

    def __iter__(self) -> Any:
        self.reads.update(self._values)
        return super().__iter__()

    def to_json(self) -> dict[str, Any]:
        self.reads.update(self._values)
        return super().to_json()


def idle_axis_problem(axis: str, kernel_params: Sequence[str]) -> str:
    """The message for an axis that reaches neither the kernel, the grid nor the compiler."""
    if axis in TRITON_KNOBS:
        why = (f"Triton's {axis} has no cuTile counterpart; cuTile's compiler hints are "
               f"{', '.join(HINT_NAMES)}")
    else:
        why = ("give it a kernel parameter's or a hint's name"
               f"{did_you_mean(axis, [*kernel_params, *HINT_NAMES])}, read it in grid/args/"
               f"hints, or drop it; hints: {', '.join(HINT_NAMES)}")
    return (f"axis {axis!r} reaches nothing (no kernel parameter, no cuTile hint, not read by "
            f"grid/args/hints), so its values would compile and tune duplicates; {why}")


def duplicate_problem(existing: Any, new: Any) -> str | None:
    """Two declarations under one name (`TunedKernel` s): in two modules, or twice in one run
    of a module. A module imported afresh (a new module object) re-declares its kernels: not a
    duplicate."""
    def where(k: Any) -> str:
        code = k.pyfunc.__code__
        return f"{k.module}.{k.pyfunc.__qualname__} ({code.co_filename}:{code.co_firstlineno})"
    if existing.module == new.module:
        if existing.pyfunc.__globals__ is not new.pyfunc.__globals__:
            return None
        old, cur = existing.pyfunc.__code__, new.pyfunc.__code__
        if (old.co_filename, old.co_firstlineno) == (cur.co_filename, cur.co_firstlineno):
            return None
    return (f"declared twice: at {where(existing)} and at {where(new)}; pass name= to tell "
            "them apart")


def checked_max_splits(value: Any, error: Callable[[str], Exception]) -> int | None:
    """``max_splits=``: None (the CLI's ``--refine N``) or a whole number from 0 to 4."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SPLITS:
        raise error(f"max_splits must be a whole number from 0 to {MAX_SPLITS} (how many times "
                    f"a Dim bucket may be split along each Dim), got {value!r}")
    return value


def workload_problem(w: Mapping[str, Any], params: Sequence[str], axes: Sequence[str],
                     kernel_params: Sequence[str]) -> str | None:
    """Why a workload's names are not the call arguments ``params``: an axis named like a call
    argument (the call and the config would both give it), most often an axis named unlike
    its kernel parameter (which turns that parameter into a call argument), or names missing
    or unknown. None when they match."""
    names = [*params, *(n for n in w if n not in params)]
    if clash := [a for a in axes if a in names]:
        free = [p for p in kernel_params if p not in w and p not in axes]
        rename = f"after the kernel parameter it sets ({', '.join(free)})" if free else \
            "after the kernel parameter it sets"
        return (f"axis {clash[0]!r} has the name of the call argument {clash[0]!r}, so the call "
                f"and the config would both give it; rename the axis {rename}, or name a hint "
                f"({', '.join(HINT_NAMES)})")
    if set(w) == set(params):
        return None
    missing = [p for p in params if p not in w]
    extra = [n for n in w if n not in params]
    stray = [a for a in axes if a not in kernel_params and a not in HINT_NAMES]
    if missing and stray and all(p in kernel_params for p in missing):
        axis = stray[0]
        return (f"axis {axis!r} matches no kernel parameter{did_you_mean(axis, missing)}, "
                f"so {', '.join(map(repr, missing))} became call argument(s) the workloads "
                f"do not give; kernel parameters: {', '.join(kernel_params)}")
    parts = [f"lacks {', '.join(map(repr, missing))}" if missing else "",
             f"has unknown {', '.join(repr(n) + did_you_mean(n, missing) for n in extra)}"
             if extra else ""]
    return (f"workload {w!r} {' and '.join(p for p in parts if p)}; the call arguments "
            f"are {', '.join(params)} (the kernel parameters that are not axes, or params=)")
