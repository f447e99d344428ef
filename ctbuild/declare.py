"""The declaration API: ``@ctbuild.autotune(...)`` over a ``@ct.kernel``.

Everything the build needs is declared next to the kernel: the search space, how a config maps
to grid/args/hints, the tuning key, the default config and the workloads. All the functions
receive the call arguments as a `Workload` (``w.A``), so one definition serves specs at build
time and real tensors at run time.
"""
from __future__ import annotations

import functools
import sys
import threading
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import cuda.tile as ct

from . import cutile
from .arch import Arch
from .declaration_checks import (
    arity_problem,
    bucket_problem,
    cap_problem,
    checked_max_splits,
    checked_names,
    checked_workloads,
    default_problem,
    did_you_mean,
    duplicate_problem,
    int_axis_problem,
    workload_problem,
)
from .declared_inputs import declared_check, declared_inputs
from .device_table import DeviceInfo, wants_device
from .dims import Bucket, expand_workloads
from .fingerprint import FingerprintError, kernel_fingerprint
from .keys import key as default_key_fn
from .keys import resolve_hints
from .space import (
    HINT_NAMES,
    Config,
    Space,
    UnknownAxisError,
    as_space,
    call_constraint,
    cap_configs,
)
from .specs import Workload

DEFAULT_CAP = 30


class DeclarationError(ValueError):
    """A declaration is wrong; the message names the kernel and the problem."""


class Candidates(NamedTuple):
    """The configs of one (kernel, workload, arch): all, after the constraint, after the cap.
    A NamedTuple: made at import (docs/architecture.md)."""
    total: int
    pruned: list[Config]
    kept: list[Config]
    default: Config


class TunedKernel:
    """A cuTile kernel with its search space, workloads and tuning policy.

    Call it like a function (``matmul(a, b, c)``) to launch the tuned config on the current
    torch stream, or ``matmul.launch(stream, a, b, c)``.
    """

    def __init__(self, kernel: Any, *, space: Any, grid: Callable[[Config, Workload], tuple],
                 args: Callable[[Config, Workload], tuple] | None, hints: Callable | None,
                 key: Callable[[Workload], tuple] | None,
                 default: Mapping[str, Any] | Callable[[Workload], Mapping[str, Any]] | None,
                 workloads: Iterable[Workload | Mapping[str, Any]], restore: Sequence[str],
                 reset_to_zero: Sequence[str], params: Sequence[str] | None, cap: int | None,
                 name: str | None, inputs: Any = None, check: Any = None,
                 max_splits: int | None = None) -> None:
        if not isinstance(kernel, ct.kernel):
            raise DeclarationError(
                f"@ctbuild.autotune must be applied over a @ct.kernel, got {kernel!r}; "
                "put @ctbuild.autotune(...) above @ct.kernel")
        self.kernel = kernel
        self.pyfunc = cutile.pyfunc(kernel)
        self.name = name or self.pyfunc.__name__
        self.module = self.pyfunc.__module__
        self._check_symbol_name()
        self._check_functions(grid, args, hints, key, default)
        functools.update_wrapper(self, self.pyfunc)
        self.space: Space = self._space_of(space)
        self.axes = self.space.axes()
        self.kernel_params = cutile.param_names(kernel)
        self._constant_params = cutile.constant_params(kernel)
        if problem := int_axis_problem(self.pyfunc, self.space):
            raise self.error(problem)
        declared = checked_workloads(workloads, self.error)
        self.params = self._call_params(params, args, declared)
        #: ``grid(cfg, w)`` or ``grid(cfg, w, dev)`` (`wants_device` tells which)
        self.grid_fn: Callable[..., Any] = grid
        self.args_fn = args
        self.hints_fn = hints
        self.key_fn = key or default_key_fn()
        self.default = default
        self.restore = checked_names("restore", restore, self.error)
        self.reset_to_zero = checked_names("reset_to_zero", reset_to_zero, self.error)
        if cap is not None and (problem := cap_problem(cap)):
            raise self.error(problem)
        self.cap: int | None = cap
        self._check_argument_names(custom_args=args is not None)
        self.declared_workloads = [self._check_workload(w) for w in declared]
        self.inputs = declared_inputs(inputs, self.params, self.declared_workloads, self.error)
        self.check = declared_check(check, self.error)
        self.max_splits = checked_max_splits(max_splits, self.error)
        self.dynamic_workloads, self.workloads, self.buckets = self._expand_workloads()
        self._wants_device = wants_device(grid)
        if default is not None and not callable(default):
            self._check_default(default)
        self._fingerprint: str | None = None
        self._constant_args: frozenset[str] | None = None
        self._runtime: Any = None
        self._call: Callable[..., None] = self._start_call
        self._launch: Callable[..., None] = self._start_launch

    # ---- declaring: the checks and derivations of __init__ --------------------------------
    def _check_symbol_name(self) -> None:
        """The function's name becomes the kernel's symbol: tileiras fails on a non-ASCII one
        with no reason given, so say it here."""
        if not self.pyfunc.__name__.isascii():
            raise self.error(f"the function name {self.pyfunc.__name__!r} has non-ASCII "
                             "letters, which cuTile cannot use as a kernel symbol; rename the "
                             "function (name= sets only ctbuild's name for it)")

    def _space_of(self, space: Any) -> Space:
        """The declared search space as a `Space`, a malformed one reported as this kernel's."""
        try:
            return as_space(space)
        except (TypeError, ValueError) as exc:
            raise self.error(f"bad search space: {exc}") from None

    def _call_params(self, params: Sequence[str] | None, args: Callable | None,
                     declared: list[Workload]) -> tuple[str, ...]:
        """The names a caller passes: ``params=``, else a custom ``args=``'s (the first
        workload's names), else the kernel parameters that are not search-space axes."""
        if params is not None:
            return checked_names("params", params, self.error)
        if args is not None and declared:
            return tuple(declared[0])  # a custom args= decides what the caller passes
        return tuple(p for p in self.kernel_params if p not in self.axes)

    def _check_argument_names(self, *, custom_args: bool) -> None:
        """restore= and reset_to_zero= name call arguments; without a custom ``args=`` every
        kernel parameter is a call argument or an axis (else the launch would lack it), which
        only a ``params=`` can break: its entries that match no kernel parameter are named (most
        often the missing one, misspelt)."""
        for what, names in (("restore", self.restore), ("reset_to_zero", self.reset_to_zero)):
            if unknown := [n for n in names if n not in self.params]:
                raise self.error(f"{what}= names unknown argument {unknown[0]!r}"
                                 f"{did_you_mean(unknown[0], self.params)}; "
                                 f"arguments: {', '.join(self.params)}")
        if not custom_args:
            missing = [p for p in self.kernel_params if p not in self.params and p not in self.axes]
            if missing:
                strays = [p for p in self.params if p not in self.kernel_params]
                named = "".join(f"; params= names {p!r}, which is no kernel parameter"
                                f"{did_you_mean(p, missing)}" for p in strays)
                raise self.error(f"kernel parameter(s) {missing} are neither call arguments nor "
                                 f"search-space axes{named}; add them to params= or the space, or pass "
                                 "args=")

    def _expand_workloads(self) -> tuple[list[Workload], list[Workload], dict[Workload, Bucket]]:
        """The declared workloads, once the tuning key's ``bucket=`` names only arguments and
        dims they have, expanded: (the dynamic ones, every workload to build and tune, the
        bucket of each representative)."""
        first = self.declared_workloads[0] if self.declared_workloads else None
        if problem := bucket_problem(self.key_fn, self.params, first):
            raise self.error(problem)
        try:
            return expand_workloads(self.declared_workloads)
        except ValueError as exc:
            raise self.error(str(exc)) from None

    # ---- naming and errors -------------------------------------------------------------
    def error(self, message: str) -> DeclarationError:
        return DeclarationError(f"kernel {self.name!r} ({self.module}): {message}")

    def __repr__(self) -> str:
        return f"<ctbuild kernel {self.name} axes={list(self.axes)}>"

    @property
    def folder(self) -> Path | None:
        """The folder of the kernel's source file (None for code with no file): the runtime
        looks for the project's ctbuild.toml upward from here."""
        filename = self.pyfunc.__code__.co_filename
        return None if filename.startswith("<") else Path(filename).parent

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            try:
                self._fingerprint = kernel_fingerprint(self.kernel)
            except FingerprintError as exc:
                raise self.error(str(exc)) from None
        return self._fingerprint

    def _check_functions(self, grid: Any, args: Any, hints: Any, key: Any, default: Any
                         ) -> None:
        """The user's functions take what they will be given (else a bare TypeError later)."""
        checks = [("grid", grid, (2, 3), "(cfg, w) or (cfg, w, dev)"),
                  ("args", args, (2,), "(cfg, w)"), ("hints", hints, (1,), "(cfg)"),
                  ("key", key, (1,), "(w)")]
        if callable(default):
            checks.append(("default", default, (1,), "(w)"))
        for what, fn, counts, shape in checks:
            if fn is not None and (problem := arity_problem(what, fn, counts, shape)):
                raise self.error(problem)

    # ---- workloads and configs ---------------------------------------------------------
    def _check_workload(self, w: Workload) -> Workload:
        if problem := workload_problem(w, self.params, self.axes, self.kernel_params):
            raise self.error(problem)
        return Workload({p: w[p] for p in self.params})

    def bind(self, *args: Any, **kwargs: Any) -> Workload:
        """Name the call arguments: ``matmul(a, b, c)`` -> ``Workload(A=a, B=b, C=c)``."""
        if len(args) > len(self.params):
            raise TypeError(f"kernel {self.name!r} takes {len(self.params)} arguments "
                            f"({', '.join(self.params)}), got {len(args)}")
        values = dict(zip(self.params, args))
        for k, v in kwargs.items():
            if k not in self.params or k in values:
                raise TypeError(f"kernel {self.name!r}: unexpected or repeated argument {k!r}")
            values[k] = v
        if len(values) != len(self.params):
            missing = [p for p in self.params if p not in values]
            raise TypeError(f"kernel {self.name!r}: missing argument(s) {missing}")
        return Workload({p: values[p] for p in self.params})

    def _check_default(self, default: Any) -> None:
        if problem := default_problem(default, self.space):
            raise self.error(problem)

    def default_config(self, w: Workload) -> Config:
        """The config used before (or without) tuning: declared, or the space's first."""
        if self.default is None:
            return Config(self.space.enumerate()[0], self.name)
        value = self.default(w) if callable(self.default) else self.default
        if callable(self.default):
            self._check_default(value)
        return Config(value, self.name)

    def candidates(self, w: Workload, arch: Arch, cap: int = DEFAULT_CAP) -> Candidates:
        """The pruned, capped candidate configs for one workload and arch.

        ``cap`` is the project's default; a ``cap=`` given in the declaration wins.
        """
        everything = [Config(c, self.name) for c in self.space.enumerate()]
        default = self.default_config(w)
        where = self.space.where
        pruned = everything
        if where is not None:
            try:
                pruned = [c for c in everything if call_constraint(where, c, w, arch)]
            except UnknownAxisError as exc:
                raise self.error(f"constraint: {exc}") from None
            except Exception as exc:
                raise self.error(f"constraint raised {type(exc).__name__}: {exc}") from None
        if not pruned:
            raise self.error(f"search space is empty after pruning for {arch} and {w!r}")
        if default not in pruned:
            raise self.error(f"default config {default!r} is rejected by the constraint for "
                             f"{arch} and {w!r}")
        return Candidates(len(everything), pruned, cap_configs(pruned, default, self.cap or cap), default)

    # ---- what a config means ------------------------------------------------------------
    def kernel_args(self, cfg: Config, w: Workload) -> tuple:
        """The arguments passed to ``ct.launch`` for this config."""
        if self.args_fn is not None:
            return tuple(self.args_fn(cfg, w))
        return tuple(w.args[p] if p in w.args else cfg[p] for p in self.kernel_params)

    def grid(self, cfg: Config, w: Workload, dev: DeviceInfo | None = None) -> tuple[int, ...]:
        """Block counts; a ``grid(cfg, w, dev)`` gets ``dev`` (the real or nominal device)."""
        if self._wants_device:
            if dev is None:
                raise self.error("grid(cfg, w, dev) needs the device; none was given")
            grid = self.grid_fn(cfg, w, dev)
        else:
            grid = self.grid_fn(cfg, w)
        return (grid,) if isinstance(grid, int) else tuple(grid)

    def hints(self, cfg: Config) -> dict[str, Any]:
        """Compiler hints for a config: ``hints(cfg)`` or the axes named like cuTile hints."""
        if self.hints_fn is not None:
            return dict(self.hints_fn(cfg))
        return {k: cfg[k] for k in HINT_NAMES if k in cfg}

    def compiler_options(self, cfg: Config) -> Any:
        """The kernel's own options with this config's hints applied."""
        return cutile.compiler_options(self.kernel, **self.hints(cfg))

    def resolved_hints(self, cfg: Config, arch: str) -> dict[str, Any]:
        return resolve_hints(self.compiler_options(cfg).hints_by_target(), arch)

    def constant_args(self, w: Workload | None = None) -> frozenset[str]:
        """The call arguments whose value is compiled in: bound to a ``ct.Constant`` parameter
        by name, or passed to one by ``args=`` (``w.eps`` into ``EPS: ct.Constant[float]``).

        With ``args=``, found once by evaluating it on the first declared workload (else on
        ``w``) and matching each constant parameter's value to the call argument it is."""
        if self._constant_args is not None:
            return self._constant_args
        names = {p for p in self.params if p in self._constant_params}
        probe = self.workloads[0] if self.workloads else w
        if self.args_fn is not None and probe is not None:
            try:
                values = self.kernel_args(self.default_config(probe), probe)
            except Exception:  # the planner reports a bad args= with its context
                return frozenset(names)
            for param, value in zip(self.kernel_params, values):
                if param in self._constant_params:
                    names |= {n for n, arg in probe.items()
                              if arg is value and isinstance(arg, (bool, int, float))}
        self._constant_args = frozenset(names)
        return self._constant_args

    def tuning_key(self, w: Workload) -> list:
        """JSON-able tuning key: the key function's value plus every constant argument."""
        consts = [w.args[p] for p in self.params if p in self.constant_args(w)]
        return [list(_jsonable(self.key_fn(w))), consts]

    # ---- launching (the runtime is made on first use, by the factory the package wires in) --
    @property
    def runtime(self) -> Any:
        runtime = self._runtime
        if runtime is None:
            with _RUNTIME_LOCK:  # many first calls at once must share one runtime
                if self._runtime is None:
                    if _make_runtime is None:
                        raise RuntimeError("no runtime is wired in: import ctbuild (the "
                                           "package wires the serve phase in)")
                    self._runtime = _make_runtime(self)
                runtime = self._runtime
        return runtime

    # The call goes straight to the runtime's hot-path form (`serve.hot_path`):
    # the getter is C, so no frame of this class runs in between (a method forwarding the
    # call cost 0.1-0.2 us).
    __call__ = property(attrgetter("_call"), doc="``kernel(*args, **kwargs)``: launch the "
                        "tuned config on the current torch stream of the arguments' device.")
    launch = property(attrgetter("_launch"), doc="``kernel.launch(stream, *args, **kwargs)``: "
                      "launch on ``stream`` (a torch stream, an external stream object or a "
                      "raw handle).")

    def _start_call(self, *args: Any, **kwargs: Any) -> None:
        """``kernel(...)`` before the runtime exists: make it (it takes over the calls)."""
        self.runtime.call(*args, **kwargs)

    def _start_launch(self, stream: Any, *args: Any, **kwargs: Any) -> None:
        """``kernel.launch(...)`` before the runtime exists: make it, as `_start_call`."""
        self.runtime.launch(stream, *args, **kwargs)

    def route(self, runtime: Any, call: Callable[..., None], launch: Callable[..., None]
              ) -> None:
        """Send ``kernel(...)`` and ``kernel.launch(...)`` to ``runtime``'s code, while it is
        still this kernel's runtime (a context reset may have dropped it meanwhile)."""
        with _ROUTE_LOCK:
            if self._runtime is runtime:
                self._call, self._launch = call, launch

    def drop_runtime(self) -> Any:
        """Forget the runtime: the next call makes a new one (for a new runtime context).
        Returns the one dropped (None: there was none), whose kernel objects the caller keeps
        alive: a CUDA graph may still launch them."""
        with _ROUTE_LOCK:
            dropped, self._runtime = self._runtime, None
            self._call, self._launch = self._start_call, self._start_launch
        return dropped

    def explain(self, *args: Any, arch: str | None = None, gpu: str | None = None,
                **kwargs: Any) -> dict[str, Any]:
        """What a call would be served with, without launching it: ``config``, ``config_from``,
        ``bucket`` (and ``sub_bucket``: where ``ctbuild tune --refine`` split the bucket, the
        sub-bucket whose record serves the size, with ``bucket_why``; ``layout_class`` where
        the record's winner for the size's layout class serves it), ``cubin_class`` (exact /
        relaxed / generic / miss), ``compile_key``, ``cached``, ``cache`` (the directory and why
        it is that one)... For a miss or an untuned call also ``why`` (what of the call no
        declared workload has: a dtype, a rank, a size, a size beyond a `Dim`'s range, a
        ``ct.Constant``'s value, a layout), ``nearest`` (the closest declared workload) and
        ``fix`` (the edit or command that covers it). With ``arch`` given no GPU is needed
        (``Tensor`` specs work); nothing is created, counted or recorded."""
        return self.runtime.explain(args, kwargs, arch=arch, gpu=gpu)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


_REGISTRY: dict[str, TunedKernel] = {}


_RUNTIME_LOCK = threading.Lock()
#: Makes a declared kernel's runtime at its first call. The package wires the serve phase in
#: (`ctbuild/__init__.py`, `set_runtime_factory`), so the declaration API imports no phase.
_make_runtime: Callable[[TunedKernel], Any] | None = None
#: Run once, at the first declaration: readies what making a runtime needs (the serve phase's
#: imports), so a kernel's first call pays none of it.
_prepare_runtime: Callable[[], None] | None = None
#: Run at each declaration: readies what that kernel's first call would otherwise compute.
_prepare_kernel: Callable[[TunedKernel], None] | None = None


def set_runtime_factory(make: Callable[[TunedKernel], Any],
                        prepare: Callable[[], None] | None = None,
                        prepare_kernel: Callable[[TunedKernel], None] | None = None) -> None:
    """Who makes a declared kernel's runtime (the serve phase's `KernelRuntime`), what to ready
    at the first declaration, and what at each."""
    global _make_runtime, _prepare_runtime, _prepare_kernel
    _make_runtime, _prepare_runtime, _prepare_kernel = make, prepare, prepare_kernel
#: Makes "is this still the kernel's runtime? then route to it" one step against a context
#: reset dropping the runtime; held for nothing else (no other lock is taken inside it).
_ROUTE_LOCK = threading.Lock()


def registered() -> list[TunedKernel]:
    """Every declared kernel, in declaration order."""
    return list(_REGISTRY.values())


def autotune(*, space: Any, grid: Callable[[Config, Workload], tuple],
             args: Callable[[Config, Workload], tuple] | None = None,
             hints: Callable[[Config], Mapping[str, Any]] | None = None,
             key: Callable[[Workload], tuple] | None = None,
             default: Mapping[str, Any] | Callable[[Workload], Mapping[str, Any]] | None = None,
             workloads: Iterable[Workload | Mapping[str, Any]] = (),
             restore: Sequence[str] = (), reset_to_zero: Sequence[str] = (),
             params: Sequence[str] | None = None, cap: int | None = None, name: str | None = None,
             inputs: Any = None, check: Any = None,
             max_splits: int | None = None) -> Callable[[Any], TunedKernel]:
    """Declare a kernel's search space, launch mapping, tuning key, default and workloads.

    Args:
        space: ``Product(...)``, ``Configs([...])``, ``Zip`` groups, or shorthand (a dict of
            axes, a list of configs). Axes named ``occupancy``, ``num_ctas``,
            ``num_worker_warps`` or ``opt_level`` are compiler hints.
        grid: ``grid(cfg, w) -> tuple`` of block counts.
        args: ``args(cfg, w) -> tuple`` passed to ``ct.launch``. Default: each kernel parameter
            from the call argument of that name, else from the config axis of that name.
        hints: ``hints(cfg) -> dict`` of compiler hints. Default: the hint-named axes.
        key: ``key(w) -> tuple``: workloads with equal keys share a winner. Default:
            shapes + dtypes + stride patterns (``ctbuild.key(bucket=...)`` buckets dims).
        default: the config used without a tuning record; a dict, or ``default(w) -> dict``.
            Default: the space's first config.
        workloads: the call arguments it will see, as dicts of `Tensor`/`Scalar`/values.
        restore: call arguments the kernel writes in place: snapshot and restore while tuning.
        reset_to_zero: accumulators zeroed before every sample and every real launch.
        params: names of the call arguments, in call order. Default: the first workload's
            names when ``args=`` is given, else the kernel parameters that are not axes.
        cap: most configs per (kernel, workload, arch) after pruning (default: the
            project's ``cap``, 30).
        name: the kernel's name in the cache and CLI (default: the function name).
        inputs: tuning values, ``{arg: (lo, hi) or fn(w, device)}`` or ``fn(w, device) -> {..}``.
        check: ``check(w) -> {arg: expected}``: the outputs every candidate must match (default:
            the default config's). Both in docs/declaring.md.
        max_splits: how many times ``ctbuild tune`` may split a `Dim` bucket along each of its
            Dims (0 to 4; default: its ``--refine N``, 3), where no config is within the tie
            band at all its sizes.
    """
    def wrap(kernel: Any) -> TunedKernel:
        tuned = TunedKernel(kernel, space=space, grid=grid, args=args, hints=hints, key=key,
                            default=default, workloads=workloads, restore=restore,
                            reset_to_zero=reset_to_zero, params=params, cap=cap, name=name,
                            inputs=inputs, check=check, max_splits=max_splits)
        caller = sys._getframe(1).f_globals.get("__name__")  # the module declaring it
        tuned.module = caller if isinstance(caller, str) else tuned.module
        existing = _REGISTRY.get(tuned.name)
        if existing is not None and (problem := duplicate_problem(existing, tuned)):
            raise tuned.error(problem)
        _REGISTRY[tuned.name] = tuned
        _ready_runtime()
        if _prepare_kernel is not None:
            _prepare_kernel(tuned)
        return tuned
    return wrap


def _ready_runtime() -> None:
    global _prepare_runtime
    prepare, _prepare_runtime = _prepare_runtime, None
    if prepare is not None:
        prepare()
