"""The one place ctbuild reaches into cuTile's private API, and the check that it still fits.

ctbuild serves precompiled CUBINs through hooks cuTile does not promise to keep: the kernel
object's ``_compile`` (the dispatcher calls it on a miss of its in-memory launch cache), a
``ct.kernel``'s ``_pyfunc``, ``_annotated_function`` and ``_compiler_options``, functions of
``cuda.tile._cext``, and for the build the compiler entry points of ``cuda.tile._compile``.
cuTile changes them between releases: `ctbuild.cutile_fit` holds the supported series
(`SUPPORTED`: cuda-tile 1.6 and 1.7, what differs between them in `SERIES`) and the check that
the hooks fit, which runs for the serve hooks when this module is imported and for the build
hooks at the compiler's first use (`compiler`).

1.7's front end also reports preview features, tile libraries to link and library lifecycle
providers, and its ``compile_cubin`` takes them; 1.6's front end returns the bytecode alone.
The rest of ctbuild calls the accessors at the end of this module (`pyfunc`, `constant_params`,
`compiler_options`, `front_end`, `compile_cubin`, ...), serves CUBINs through `ServingKernel`
(the ``_compile`` override) and counts cuTile's own compiles with `compiles_in_this_thread`;
only the front end (`ctbuild.tileir`, shared by the build and ``CTBUILD_VERIFY=ir``) also
drives cuTile's compiler itself.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import tempfile
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import cuda.tile as ct

from .arch import Arch
from .cutile_fit import (  # noqa: F401 - the rest of ctbuild reads these here too
    SERIES,
    SUPPORTED,
    TESTED,
    Series,
    UnsupportedCuTileError,
    check,
    check_build,
    problems,
    series,
    serve_problems,
    version,
)

check(serve_problems())



# ---- the hooks, for the rest of ctbuild --------------------------------------------------------
def pyfunc(kernel: Any) -> Callable[..., Any]:
    """The Python function a ``ct.kernel`` wraps (``kernel`` itself when it is not one)."""
    return kernel._pyfunc if isinstance(kernel, ct.kernel) else kernel


def tile_function(func: Any) -> Any:
    """What cuTile's front end compiles for ``func``: a ``ct.kernel``'s Python function, the
    function a ``@ct.function`` wrapper wraps, else ``func`` itself (it follows no other
    ``__wrapped__``: a user decorator's wrapper is compiled as itself)."""
    func = pyfunc(func)
    while getattr(func, "_cutile_function_wrapper", False):
        func = func.__wrapped__
    return func


def annotated_function(kernel: ct.kernel) -> Any:
    """cuTile's parsed view of a kernel's parameters (what the dispatcher and compiler use):
    ``.pysig`` (an `inspect.Signature`), ``.parameter_annotations``, ``.pyfunc``."""
    return kernel._annotated_function


def param_names(kernel: ct.kernel) -> tuple[str, ...]:
    """A kernel's parameter names, in order."""
    return tuple(kernel._annotated_function.pysig.parameters)


def constant_params(kernel: ct.kernel) -> set[str]:
    """Names of a kernel's ``ct.Constant`` parameters."""
    annotated = kernel._annotated_function
    return {p for p, a in zip(annotated.pysig.parameters, annotated.parameter_annotations)
            if getattr(a, "constant", False)}


def compiler_options(kernel: ct.kernel, **hints: Any) -> Any:
    """A kernel's compiler options (a dataclass: num_ctas, occupancy, opt_level, ...), with
    ``hints`` applied (a copy; the kernel's own options are never changed).

    cuTile validates the hints, and what it takes differs by version (``num_worker_warps``:
    4 or 8 in 1.6, a power of 2 up to 32 in 1.7), so its error names the version."""
    try:
        return dataclasses.replace(kernel._compiler_options, **hints)
    except ValueError as exc:
        raise ValueError(f"{exc} (in cuda-tile {version()})") from None


def compute_capability(device: int | None = None) -> tuple[int, int]:
    """(major, minor) of a CUDA device (default: the current one), as the dispatcher sees it."""
    from cuda.tile._cext import get_compute_capability
    major, minor = get_compute_capability() if device is None else \
        get_compute_capability(device)
    return int(major), int(minor)


_current_capability = compute_capability  # for `ServingKernel._compile`, whose parameter shadows it


def current_arch(device: int | None = None) -> Arch:
    """The `Arch` of a CUDA device (default: the current one), through the CUDA driver."""
    return Arch.from_capability(*compute_capability(device))


def driver_version() -> int:
    """The CUDA driver version (e.g. 13000)."""
    from cuda.tile._cext import get_driver_version
    return int(get_driver_version())


def compiler() -> ModuleType:
    """cuTile's compiler module (``compile_tile`` and friends); imported on first build use,
    when its private hooks are checked (`build_problems`)."""
    check_build()
    return importlib.import_module("cuda.tile._compile")


class _NoTorch:
    """A meta-path finder that answers every ``torch`` import with ModuleNotFoundError, as
    on a machine without torch."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


#: Whether this process loaded cuTile's compiler with torch hidden (`load_compiler_without_torch`).
_TORCH_HIDDEN = False


def load_compiler_without_torch() -> bool:
    """Import cuTile's compiler without importing torch, in a process that has imported
    neither; returns whether it did. Call it only after the project's kernel modules are
    imported.

    Importing the compiler makes cuTile's extension look for torch (to recognise its dtypes),
    which imports torch where it is installed: 4-6 s per process on a 64-core host with 64
    compile workers starting at once, most of a worker's start-up. cuTile looks only once: a
    compiler loaded without torch never reads a torch dtype, even after torch is imported, so
    a body naming one (``ct.arange(n, dtype=torch.int32)``, as TileGym's kernels do) fails
    its front end. A kernel module that names torch dtypes imports torch itself, so once the
    modules are imported torch is hidden only from processes whose kernels cannot name it.
    Later imports of torch in the process work as usual (`torch_blind` tells)."""
    global _TORCH_HIDDEN
    if "torch" in sys.modules or "cuda.tile._compile" in sys.modules:
        return False
    finder = _NoTorch()
    sys.meta_path.insert(0, finder)
    try:
        compiler()
    finally:
        sys.meta_path.remove(finder)
    _TORCH_HIDDEN = True
    return True


def torch_blind() -> bool:
    """Whether torch was imported after cuTile's compiler was loaded without it: the front end
    then refuses torch dtypes in kernel bodies, which a process that imported torch first
    accepts (a kernel module imported after `load_compiler_without_torch`)."""
    return _TORCH_HIDDEN and "torch" in sys.modules


class TorchBlindError(RuntimeError):
    """The front end failed in a `torch_blind` process: its answer may not be the build's."""


def find_compiler_bin() -> tuple[str, bool]:
    """(path to tileiras, whether it uses $CUDA_HOME's ptxas/libnvvm), as cuTile finds it;
    FileNotFoundError when there is none."""
    binary = compiler()._find_compiler_bin()
    return binary.path, bool(binary.pass_cuda_home_var)


@functools.lru_cache(maxsize=1)
def max_bytecode_version() -> Any:
    """The newest TileIR bytecode version tileiras takes (asks tileiras once per process)."""
    with tempfile.TemporaryDirectory() as tmp:
        return compiler()._get_max_supported_bytecode_version(tmp)


def compiler_lock() -> Any:
    """cuTile's process-wide compiler lock (re-entrant): hold it around every compile step and
    while changing what a compile sees (the environment), as cuTile's own compile does."""
    return compiler()._compiler_lock


class FrontEnd(NamedTuple):
    """cuTile's front-end output for one signature: the TileIR bytecode, and what tileiras
    needs beside it. The extras are always empty under cuda-tile 1.6, whose front end has none
    of them (foreign calls, tile libraries and library lifecycles came with 1.7). A
    NamedTuple: made at import (docs/architecture.md)."""
    bytecode: bytes
    preview_features: tuple[str, ...] = ()
    #: (path, version) of each tile library tileiras links.
    linker_inputs: tuple[tuple[Any, str], ...] = ()
    #: Library lifecycle provider modules the launch would have to initialize.
    lifecycle_providers: tuple[ModuleType, ...] = ()


def front_end(kernel: ct.kernel, signature: Any, arch: str, options: Any,
              bytecode_version: Any = None) -> FrontEnd:
    """Run cuTile's front end (what ``compile_tile`` does before tileiras) for one signature,
    with debug info anonymized, so no file path or line number reaches the bytecode. Callers
    hold `compiler_lock` and the compile env; ``bytecode_version`` None asks tileiras (once per
    process), a serving process passes its toolchain profile's (`bytecode_version`)."""
    from cuda.tile._passes.ast2hir import HirMode, get_function_hir

    cc = compiler()
    ann = kernel._annotated_function
    signature = signature.with_mangled_symbol(ann.pyfunc.__name__)
    version = max_bytecode_version() if bytecode_version is None else bytecode_version
    keeper = cc._IrKeeper(ann_func=ann,
                          func_hir=get_function_hir(ann.pyfunc, mode=HirMode.ENTRY_POINT),
                          signatures=[signature], bytecode_version=version,
                          sm_arch=arch, log_cutile_ir=False, keep_all=False)
    try:
        result = cc._get_bytecode(keeper, options, anonymize_debug_info=True)
    except Exception as exc:
        if torch_blind():  # never let a misloaded compiler pass for a refusal of the body
            raise TorchBlindError(
                f"cuTile's compiler was loaded before torch was imported, so its front end "
                f"cannot read torch dtypes (a ctbuild bug, please report): "
                f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}") from None
        raise
    if not _installed_series().bytecode_result:
        return FrontEnd(bytes(result))
    return FrontEnd(bytes(result.bytecode), tuple(result.preview_features),
                    tuple(result.linker_inputs), tuple(result.library_lifecycle_providers))


def compile_cubin(bytecode_file: str, options: Any, arch: str, ir: FrontEnd,
                  timeout_sec: float | None) -> Any:
    """tileiras on a bytecode file (the path of the CUBIN it wrote), with the front end's
    preview features and tile libraries where this cuda-tile passes them. Callers hold
    `compiler_lock` and the compile env."""
    extras = {"preview_features": ir.preview_features,
              "linker_inputs": tuple(path for path, _ in ir.linker_inputs)}
    dropped = [k for k, v in extras.items() if v and k not in _installed_series().cubin_extras]
    if dropped:  # cannot happen with this cuda-tile's own front end; never drop them silently
        raise UnsupportedCuTileError(f"cuda-tile {version()} cannot pass {', '.join(dropped)} "
                                     "to tileiras")
    return compiler().compile_cubin(bytecode_file, options, arch, timeout_sec=timeout_sec,
                                    **{k: extras[k] for k in _installed_series().cubin_extras})


def bytecode_version(name: str) -> Any:
    """The TileIR bytecode version a toolchain profile names ("13.4"), without tileiras."""
    from cuda.tile._bytecode.version import BytecodeVersion
    return BytecodeVersion["V_" + name.replace(".", "_")]


def _installed_series() -> Series:
    found = series()
    if found is None:  # `check` refused it at import; only a changed __version__ gets here
        raise UnsupportedCuTileError(f"cuda-tile {version()} is not supported ({SUPPORTED})")
    return found


# ---- counting cuTile's own compiles -------------------------------------------------------------
_COMPILES = threading.local()
_COUNTING_INSTALLED = threading.Lock()
#: Whether `_install_compile_count` ran (the wrapper is on, or `_CountOnLoad` waits for the module).
_COUNT_HOOKED = False


def _install_compile_count() -> None:
    """Wrap ``compile_tile`` once per process with a per-thread counter, and never unwrap it.

    Installed once and left in place (under a lock), so concurrent tuners never restore each
    other's wrapper; each thread reads only its own count, so a compile in another thread is
    never attributed to this one. Every in-process tileiras run of cuTile's JIT goes through
    ``compile_tile`` (``kernel._compile`` looks it up on each call). Where cuTile's compiler is
    not loaded yet, no compile has run, and the wrapper goes on as the module loads
    (`_CountOnLoad`): a measuring process that compiles nothing never imports the compiler
    (0.3 s of each tune's first key on an H200 host)."""
    global _COUNT_HOOKED
    with _COUNTING_INSTALLED:
        if _COUNT_HOOKED:
            return
        _COUNT_HOOKED = True
        loaded = sys.modules.get("cuda.tile._compile")
        if loaded is not None:
            _count_compiles(loaded)
        else:
            sys.meta_path.insert(0, _CountOnLoad())


def _count_compiles(cc: ModuleType) -> None:
    """Replace ``cc.compile_tile`` with its counted wrapper (a cuTile without one is left as
    it is: `check_build` names it at the compiler's first use)."""
    original = getattr(cc, "compile_tile", None)
    if original is None or getattr(original, "_ctbuild_counted", False):
        return

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        _COMPILES.n = getattr(_COMPILES, "n", 0) + 1
        return original(*args, **kwargs)

    counted._ctbuild_counted = True  # type: ignore[attr-defined]
    setattr(cc, "compile_tile", counted)  # noqa: B010 - a module attribute mypy cannot see


class _CountOnLoad(importlib.abc.MetaPathFinder):
    """Finds ``cuda.tile._compile`` on the path as the path finder would, and counts its
    compiles as soon as it has run, before anything can call ``compile_tile``; then leaves
    ``sys.meta_path``. A lookup that imports nothing (`cutile_fit` reads the module's
    source) leaves it in place."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "cuda.tile._compile":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        loader = spec.loader if spec is not None else None
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                run(module)
                _count_compiles(module)
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self)
            loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def compiles_in_this_thread() -> int:
    """How many times cuTile's ``compile_tile`` ran in this thread since counting began (the
    first call begins it; compare two readings)."""
    _install_compile_count()
    return int(getattr(_COMPILES, "n", 0))


#: A new empty ``_compile`` fourth item of the type this cuda-tile's dispatcher takes.
_NO_LIFECYCLE = _installed_series().lifecycle


# ---- serving CUBINs through cuTile's dispatcher ---------------------------------------------------
class ServingKernel(ct.kernel):
    """Base of a ``ct.kernel`` whose CUBINs come from elsewhere (the cache).

    cuTile's dispatcher derives the launch signature and, on a miss of its in-memory launch
    cache, calls ``_compile(signature, context, compute_capability)``; this class overrides
    that hook and asks `serve` instead. `compile_with_cutile` runs cuTile's own compile (JIT)."""

    def _compile(self, signature: Any, context: Any,
                 compute_capability: tuple[int, int] | None = None) -> tuple:
        major, minor = compute_capability or _current_capability()
        cubin, symbol = self.serve(signature, context, Arch.from_capability(major, minor))
        return cubin, symbol, None, _NO_LIFECYCLE()

    def serve(self, signature: Any, context: Any, arch: Arch) -> tuple[bytes, str]:
        """(cubin, symbol) to launch for ``signature`` on ``arch``; subclasses decide."""
        raise NotImplementedError

    def compile_with_cutile(self, signature: Any, context: Any, arch: Arch
                            ) -> tuple[bytes, str, tuple[Any, ...]]:
        """(cubin, symbol, library lifecycle providers) from cuTile's own compile path."""
        cubin, symbol, _, lifecycle = ct.kernel._compile(self, signature, context,
                                                         (arch.major, arch.minor))
        return cubin, symbol, tuple(lifecycle)


class _Walked(Exception):
    """Raised by `_WalkingKernel._compile`: the launch path was walked, nothing launched."""


class _WalkingKernel(ct.kernel):
    """A kernel whose compile step stops its launch: `walk_launch_path` uses it."""

    def _compile(self, signature: Any, context: Any,
                 compute_capability: tuple[int, int] | None = None) -> tuple:
        signature.with_mangled_symbol(self._pyfunc.__name__)
        raise _Walked


def _walked_body(x: Any) -> None:
    """The body of the kernel whose launch `walk_launch_path` walks: never compiled."""


def walk_launch_path(stream: Any, array: Any) -> bool:
    """Walk cuTile's launch path once, launching nothing; whether it got to the compile step.

    A process's first ``ct.launch`` initialises cuTile's dispatcher (its driver entry points,
    the device's facts) and its first mangled symbol compiles the name mangler's patterns:
    about 3 ms on the host that a first served call would otherwise pay. A launch of a kernel
    whose ``_compile`` raises does both and stops before any module is loaded or launched.
    `ctbuild.serve.preload` calls it on its thread."""
    try:
        ct.launch(stream, (1, 1, 1), _WalkingKernel(_walked_body), (array,))
    except _Walked:
        return True
    except Exception:  # noqa: BLE001 - an optimisation: the first call walks it then
        return False
    return False


def load_module(stream: Any, kernel: Any, args: tuple) -> None:
    """Have cuTile load ``kernel``'s module for the launch signature of ``args`` into its
    launch cache, running nothing.

    cuTile's launch finds the kernel in its in-memory cache by the arguments' signature, on a
    miss asks ``_compile`` for the CUBIN, loads its module with the driver and stores it there,
    and only then calls ``cuLaunchKernel``. A grid of no block gets that far, and the driver
    refuses it ("invalid argument", an error that leaves the context usable): the module stays
    loaded, and a later launch with a like signature launches it straight away. So ``args``
    need only have the signature: `ctbuild.serve.standins` makes tensors of a record's shapes
    with no memory behind them, which nothing reads. Anything else the launch raises (a miss,
    a cuTile that refuses an empty grid before its cache) is raised."""
    try:
        ct.launch(stream, (0, 1, 1), kernel, args)
    except RuntimeError as exc:
        if "invalid argument" not in str(exc):
            raise


def mangled_symbol(signature: Any, function_name: str) -> str:
    """The symbol cuTile names ``signature``'s kernel with: ``signature.with_mangled_symbol``'s,
    without the check that the name demangles back, which compiles some twenty patterns on its
    first use in a process (about 2 ms of a first served call, 0.3 ms of each later one). The
    mangler's own parts make it; where they are not as expected, the public call does."""
    try:
        from cuda.tile.compilation import _name_mangling as m
        aliases, _ = m._map_alias_groups(signature.parameters)
        found = m._CollectedGlobals(dataclasses=set(), enums=set())
        return function_name + f"_K{signature.calling_convention.code}" + "".join(
            "_" + m._mangle_constraint(p, aliases, found) for p in signature.parameters)
    except Exception:  # noqa: BLE001 - another cuTile's mangler: its public form
        return str(signature.with_mangled_symbol(function_name).symbol)


# ---- timing one launch ------------------------------------------------------------------------
def benchmark_sample(stream: Any, grid: tuple[int, ...], kernel: Any, args: tuple,
                     flush_l2: bool = True) -> float:
    """Microseconds of one launch, timed the way ``ct.tune.exhaustive_search`` times each of its
    samples (a CUDA graph, the L2 flushed before it when ``flush_l2``). The runoff between
    finalists uses it to interleave candidates round by round, which cuTile's search does not."""
    from cuda.tile._cext import _benchmark
    installed = series()
    if installed is not None and not installed.benchmark_flush_arg:
        return float(_benchmark(stream, grid, kernel, args))
    return float(_benchmark(stream, grid, kernel, args, flush_l2))
