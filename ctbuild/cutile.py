"""The one place ctbuild reaches into cuTile's private API, and the check that it still fits.

ctbuild serves precompiled CUBINs through hooks cuTile does not promise to keep: the kernel
object's ``_compile`` (the dispatcher calls it on a miss of its in-memory launch cache), a
``ct.kernel``'s ``_pyfunc``, ``_annotated_function`` and ``_compiler_options``, functions of
``cuda.tile._cext``, and for the build the compiler entry points of ``cuda.tile._compile``.
They changed between cuda-tile 1.6 and 1.7, so ctbuild pins one version and `check` runs at
import: an unsupported cuda-tile fails at once, with one error naming every hook that changed,
rather than mis-launching later or being chased through the code one hook at a time.

The rest of ctbuild calls the accessors at the end of this module (`pyfunc`,
`constant_params`, `compiler_options`, `compute_capability`, ...), serves CUBINs through
`ServingKernel` (the ``_compile`` override) and counts cuTile's own compiles with
`compiles_in_this_thread`; only the front end (`ctbuild.tileir`, shared by the build and
``CTBUILD_VERIFY=ir``) also drives cuTile's compiler itself.

Serve hooks are checked on the live objects. Build hooks are checked from their module's
source (names defined there), because importing cuTile's compiler costs seconds and the serve
path never needs it; `compiler` imports it when a build does.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import sys
import tempfile
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import cuda.tile as ct

from .arch import Arch

SUPPORTED_CUTILE = "1.7.0"

#: ``kernel._compile``'s leading parameters, which `ServedKernel` overrides and calls.
COMPILE_PARAMS = ["self", "signature", "context", "compute_capability"]
#: Fields of a kernel's compiler options that configs set as hints.
OPTION_FIELDS = {"num_ctas", "occupancy", "opt_level", "num_worker_warps"}
#: Private functions and classes ctbuild uses, by module.
SERVE_NAMES = {
    "cuda.tile._cext": ("get_compute_capability", "get_driver_version", "TileContext"),
    "cuda.tile._context": ("TileContextConfig",),
}
BUILD_NAMES = {
    "cuda.tile._compile": ("compile_tile", "compile_cubin", "_compiler_lock", "_get_bytecode",
                           "_IrKeeper", "_find_compiler_bin",
                           "_get_max_supported_bytecode_version"),
    "cuda.tile._passes.ast2hir": ("HirMode", "get_function_hir"),
    "cuda.tile._bytecode.version": ("BytecodeVersion",),
}


class UnsupportedCuTileError(RuntimeError):
    """The installed cuda-tile is not one whose private interface ctbuild was built for."""


def _probe(X, N: ct.Constant[int]):  # noqa: N803 - a kernel's parameter names, as users write them
    """A kernel shape to check the per-kernel hooks on (never compiled)."""


def problems() -> list[str]:
    """Every hook that is not what ctbuild relies on (empty when all fit)."""
    found = []
    version = str(getattr(ct, "__version__", "unknown"))
    if version != SUPPORTED_CUTILE:
        found.append(f"version {version} (ctbuild supports {SUPPORTED_CUTILE})")
    compile_fn = getattr(ct.kernel, "_compile", None)
    if compile_fn is None:
        found.append("kernel._compile is gone")
    else:
        params = list(inspect.signature(compile_fn).parameters)
        if params[:4] != COMPILE_PARAMS:
            found.append(f"kernel._compile{tuple(params)} (expected {tuple(COMPILE_PARAMS)})")
    found += _kernel_problems()
    for module, names in SERVE_NAMES.items():
        found += _missing(module, names, _live_names)
    for module, names in BUILD_NAMES.items():
        found += _missing(module, names, _source_names)
    return found


def _kernel_problems() -> list[str]:
    try:
        kernel = ct.kernel(_probe)
    except Exception as exc:
        return [f"ct.kernel(...) failed on a plain kernel: {type(exc).__name__}: {exc}"]
    found = []
    if getattr(kernel, "_pyfunc", None) is not _probe:
        found.append("kernel._pyfunc")
    annotated = getattr(kernel, "_annotated_function", None)
    if annotated is None:
        found.append("kernel._annotated_function")
    else:
        try:
            params = list(annotated.pysig.parameters)
            constants = [getattr(a, "constant", None) for a in annotated.parameter_annotations]
            wrapped = annotated.pyfunc
        except AttributeError as exc:
            found.append(f"kernel._annotated_function ({exc})")
        else:
            if wrapped is not _probe:
                found.append("kernel._annotated_function.pyfunc")
            if params != ["X", "N"] or constants != [False, True]:
                found.append("kernel._annotated_function.pysig/parameter_annotations "
                             f"(got {params}, constant flags {constants})")
    options = getattr(kernel, "_compiler_options", None)
    fields = {f.name for f in dataclasses.fields(options)} if dataclasses.is_dataclass(
        options) else set()
    if not OPTION_FIELDS <= fields:
        found.append(f"kernel._compiler_options (lacks {sorted(OPTION_FIELDS - fields)})")
    return found


def _live_names(module: str) -> set[str]:
    return set(dir(importlib.import_module(module)))


def _source_names(module: str) -> set[str]:
    """Names a module defines or imports at top level, read from its source (not imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _missing(module: str, names: tuple[str, ...], lister: Callable[[str], set[str]]
             ) -> list[str]:
    try:
        present = lister(module)
    except (ImportError, OSError, SyntaxError) as exc:
        return [f"{module} ({exc})"]
    return [f"{module}.{n}" for n in names if n not in present]


def check() -> None:
    """Raise `UnsupportedCuTileError` naming every hook that changed."""
    found = problems()
    if found:
        raise UnsupportedCuTileError(
            "ctbuild cannot use this cuda-tile; changed: " + "; ".join(found)
            + f". Install the supported version: pip install "
              f"'cuda-tile[tileiras]=={SUPPORTED_CUTILE}'")


check()


# ---- the hooks, for the rest of ctbuild --------------------------------------------------------
def pyfunc(kernel: Any) -> Callable[..., Any]:
    """The Python function a ``ct.kernel`` wraps (``kernel`` itself when it is not one)."""
    return kernel._pyfunc if isinstance(kernel, ct.kernel) else kernel


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
    ``hints`` applied (a copy; the kernel's own options are never changed)."""
    return dataclasses.replace(kernel._compiler_options, **hints)


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
    """cuTile's compiler module (``compile_tile`` and friends); imported on first build use."""
    return importlib.import_module("cuda.tile._compile")


class _NoTorch:
    """A meta-path finder that answers every ``torch`` import with ModuleNotFoundError, as
    on a machine without torch."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def load_compiler_without_torch() -> bool:
    """Import cuTile's compiler without importing torch, in a process that has imported
    neither; returns whether it did.

    Importing the compiler makes cuTile's extension look for torch (to recognise its dtypes),
    which imports torch where it is installed: 4-6 s per process on a 64-core host with 64
    compile workers starting at once, most of a worker's start-up. A compile never needs
    torch (the container build has none, and a kernel that names torch dtypes imports torch
    in its module, which was imported before this runs), so a build worker keeps it out.
    Later imports of torch in the process work as usual."""
    if "torch" in sys.modules or "cuda.tile._compile" in sys.modules:
        return False
    finder = _NoTorch()
    sys.meta_path.insert(0, finder)
    try:
        compiler()
    finally:
        sys.meta_path.remove(finder)
    return True


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
    """cuTile's process-wide compiler lock (re-entrant): hold it while changing what a compile
    sees (the environment), as cuTile's own compile does."""
    return compiler()._compiler_lock


def front_end(kernel: ct.kernel, signature: Any, options: Any, arch: str,
              bytecode_version: Any = None) -> Any:
    """cuTile's front end for one signature, as ``compile_tile`` runs it before tileiras, with
    debug info anonymized: its result's ``bytecode``, ``preview_features``, ``linker_inputs``,
    ``library_lifecycle_providers``. ``bytecode_version`` None asks tileiras (once)."""
    cc = compiler()
    from cuda.tile._passes.ast2hir import HirMode, get_function_hir

    ann = kernel._annotated_function
    signature = signature.with_mangled_symbol(ann.pyfunc.__name__)
    with cc._compiler_lock:
        version = max_bytecode_version() if bytecode_version is None else bytecode_version
        keeper = cc._IrKeeper(
            ann_func=ann, func_hir=get_function_hir(ann.pyfunc, mode=HirMode.ENTRY_POINT),
            signatures=[signature], bytecode_version=version, sm_arch=arch,
            log_cutile_ir=False, keep_all=False)
        return cc._get_bytecode(keeper, options, anonymize_debug_info=True)


def bytecode_version(name: str) -> Any:
    """The TileIR bytecode version a toolchain profile names ("13.4"), without tileiras."""
    from cuda.tile._bytecode.version import BytecodeVersion
    return BytecodeVersion["V_" + name.replace(".", "_")]


# ---- counting cuTile's own compiles -------------------------------------------------------------
_COMPILES = threading.local()
_COUNTING_INSTALLED = threading.Lock()


def _install_compile_count() -> None:
    """Wrap ``compile_tile`` once per process with a per-thread counter, and never unwrap it.

    Installed once and left in place (under a lock), so concurrent tuners never restore each
    other's wrapper; each thread reads only its own count, so a compile in another thread is
    never attributed to this one. Every in-process tileiras run of cuTile's JIT goes through
    ``compile_tile`` (``kernel._compile`` looks it up on each call)."""
    cc = compiler()
    with _COUNTING_INSTALLED:
        if getattr(cc.compile_tile, "_ctbuild_counted", False):
            return
        original = cc.compile_tile

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            _COMPILES.n = getattr(_COMPILES, "n", 0) + 1
            return original(*args, **kwargs)

        counted._ctbuild_counted = True  # type: ignore[attr-defined]
        setattr(cc, "compile_tile", counted)  # noqa: B010 - a module attribute mypy cannot see


def compiles_in_this_thread() -> int:
    """How many times cuTile's ``compile_tile`` ran in this thread since counting began (the
    first call begins it; compare two readings)."""
    _install_compile_count()
    return int(getattr(_COMPILES, "n", 0))


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
        return cubin, symbol, None, ()

    def serve(self, signature: Any, context: Any, arch: Arch) -> tuple[bytes, str]:
        """(cubin, symbol) to launch for ``signature`` on ``arch``; subclasses decide."""
        raise NotImplementedError

    def compile_with_cutile(self, signature: Any, context: Any, arch: Arch
                            ) -> tuple[bytes, str, tuple[Any, ...]]:
        """(cubin, symbol, library lifecycle providers) from cuTile's own compile path."""
        cubin, symbol, _, lifecycle = ct.kernel._compile(self, signature, context,
                                                         (arch.major, arch.minor))
        return cubin, symbol, tuple(lifecycle)
