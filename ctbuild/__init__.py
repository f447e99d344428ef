"""ctbuild: precompile and autotune cuTile kernels at build time; start warm at run time.

Declare next to the kernel::

    @ctbuild.autotune(space=Product(TM=[64, 128], TN=[64, 128]), grid=..., workloads=[...])
    @ct.kernel
    def matmul(A, B, C, TM: ct.Constant[int], TN: ct.Constant[int]): ...

then ``ctbuild precompile`` (CPU, container build), ``ctbuild tune`` (one GPU) and call
``matmul(a, b, c)`` at run time. Importing this package imports neither Ray nor the farm.
"""
import time as _time

_IMPORT_START = _time.perf_counter()

from .arch import Arch  # noqa: E402
from .declare import (  # noqa: E402
    DeclarationError,
    TunedKernel,
    autotune,
    registered,
    set_runtime_factory,
)
from .dims import Dim  # noqa: E402
from .keys import key, pow2  # noqa: E402
from .serve.torch_op import torch_op  # noqa: E402
from .space import Config, Configs, Product, Zip  # noqa: E402
from .specs import Scalar, Tensor, Workload  # noqa: E402

__version__ = "0.1.0"
#: Seconds ``import ctbuild`` took (the cold-start ledger's first phase).
IMPORT_SECONDS = _time.perf_counter() - _IMPORT_START


def _serving() -> bool:
    """Whether this process looks like one that serves: torch is already imported. A compile
    worker or a CLI command that imports the user's kernels never imports torch (its import
    takes seconds); there a kernel's first call readies what it needs itself."""
    import sys
    return "torch" in sys.modules


def _import_serve() -> None:
    """The serve phase's modules, imported at the first kernel declaration (the user's module
    import), not at ``import ctbuild`` (a CLI command that declares nothing never pays) nor at
    a kernel's first call (which should cost only the CUBIN's load and launch). The cold-start
    ledger times it. Only in a process that serves (`_serving`)."""
    if not _serving():
        return
    started = _time.perf_counter()
    from . import toolchain  # noqa: F401 - the runtime's context reads the cache's profiles
    from .serve.kernel_runtime import KernelRuntime  # noqa: F401
    from .serve.layout_guard import native_guard
    from .serve.ledger import LEDGER
    native_guard()  # the C hot path's import and self-test (~1 ms), once per process
    LEDGER.imported(_time.perf_counter() - started)


def _serve_runtime(tuned: TunedKernel) -> object:
    """A declared kernel's runtime, made at its first call."""
    from .serve.kernel_runtime import KernelRuntime
    return KernelRuntime(tuned)


def _prepare_kernel(tuned: TunedKernel) -> None:
    """A kernel was declared: in a process that serves (`_serving`), parse and analyse its
    source now (`fingerprint.prepare`, ~1 ms a kernel), so that its first call takes only the
    values its code reads."""
    if _serving():
        from .fingerprint import prepare
        prepare(tuned.kernel)


set_runtime_factory(_serve_runtime, _import_serve, _prepare_kernel)


def _preload_from_env() -> None:
    """``CTBUILD_PRELOAD=1``: read this GPU's tuned CUBINs on a thread from now on."""
    import os
    if os.environ.get("CTBUILD_PRELOAD"):
        from .serve.preload import start_from_env
        start_from_env()


_preload_from_env()

__all__ = ["Arch", "Config", "Dim", "Configs", "DeclarationError", "Product", "Scalar", "Tensor",
           "TunedKernel", "Workload", "Zip", "autotune", "key", "pow2", "registered", "torch_op"]
