"""Launching cuTile kernels with CUBINs served from the ctbuild cache.

cuTile's dispatcher derives a `KernelSignature` from the launch arguments and, on a miss of its
in-memory cache, calls ``kernel._compile(signature, context, (major, minor))``. `ServedKernel`
overrides that one method (through `ctbuild.cutile.ServingKernel`, which owns the private
interface and checks it at import) to look the CUBIN up by compile key instead of running
tileiras.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cuda.tile as ct

from ..arch import Arch
from ..cutile import ServingKernel, mangled_symbol
from ..keys import kernel_compile_key
from ..signature import signature_text
from ..signature_classes import EXACT_WEAKENING, Weakening, dynamic_patterns, lattice, weakened
from ..space import Config
from .kernel_store import KernelStore
from .ledger import LEDGER

if TYPE_CHECKING:
    from ..declare import TunedKernel

log = logging.getLogger("ctbuild")

@dataclass
class ServeStats:
    """What the served kernels of one process did (thread-safe counters). ``jit_compiles``
    counts CUBINs tileiras produced; attempts that failed count in ``jit_failures``;
    ``exact``/``relaxed``/``generic`` count cache hits by signature class."""
    hits: int = 0
    misses: int = 0
    jit_compiles: int = 0
    jit_failures: int = 0
    exact: int = 0
    relaxed: int = 0
    generic: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


#: Most `CubinSource.candidates` lists one source remembers.
MAX_CANDIDATE_LISTS = 4096

#: Process-wide counters of served kernels.
STATS = ServeStats()

#: Per thread: the signature class the last `ServedKernel._compile` served (the runtime reads
#: it after a first launch to tell what the dispatcher really loaded).
LAST_SERVED = threading.local()

#: Called on a CUBIN miss with (served kernel, signature, context, arch); returns
#: (cubin, symbol) to launch, or raises: `MissPolicy.on_launch_miss` of the runtime context.
MissHandler = Callable[["ServedKernel", Any, Any, str], tuple[bytes, str]]


class _Candidates:
    """One call signature's (weakening, weakened signature, compile key) list, derived only as
    far as a lookup reads it: the first cached class ends the search, so the keys of weaker
    classes are seldom needed (each costs a signature rewrite and a hash)."""

    def __init__(self, weakenings: Sequence[Weakening],
                 make: Callable[[Weakening], tuple[Weakening, Any, str]]) -> None:
        self._weakenings = tuple(weakenings)
        self._make = make
        self._done: list[tuple[Weakening, Any, str]] = []
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[tuple[Weakening, Any, str]]:
        for i in range(len(self._weakenings)):
            if i >= len(self._done):
                with self._lock:
                    while len(self._done) <= i:
                        self._done.append(self._make(self._weakenings[len(self._done)]))
            yield self._done[i]


@dataclass
class CubinSource:
    """Where served kernels get CUBINs: a cache store under one toolchain fingerprint."""
    store: KernelStore | None
    toolchain_fp: str | None
    on_miss: MissHandler | None = None
    #: (tuned, cfg, signature, arch, key, meta) -> may it be served: `IrVerifier` (marked
    #: kernels, every kernel with ``CTBUILD_VERIFY=ir``)
    verify: Callable[..., bool] | None = None
    #: `candidates` by (kernel, config, exact signature, arch): resolving a call and serving
    #: its launch ask for the same list.
    _candidates: dict[tuple, _Candidates] = field(default_factory=dict, repr=False)
    #: `covering`'s found CUBINs, by the same memo key
    _covered: dict[tuple, tuple[str, str]] = field(default_factory=dict, repr=False)

    def key_for(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str,
                text: str | None = None) -> str:
        """The compile key of the exact CUBIN for ``signature``: the first of its `candidates`
        (a miss after `covering` reads the key that lookup derived)."""
        return next(self.candidates(tuned, cfg, signature, arch, text))[2]

    def candidates(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str,
                   text: str | None = None) -> Iterator[tuple[Weakening, Any, str]]:
        """(weakening, weakened signature without symbol, compile key) to try for a call, most
        specialised first: exact, relaxed under each declared dynamic pattern, generic.
        ``text``: the signature's `signature_text`, where the caller has it."""
        text = text or signature_text(signature)
        memo = _memo_key(tuned, cfg, text, arch)
        found = self._candidates.get(memo)
        if found is None:
            def make(weakening: Weakening) -> tuple[Weakening, Any, str]:
                sig = weakened(signature, weakening)
                # the exact class's signature is the call's, so is its text
                exact = text if weakening.cls == EXACT_WEAKENING.cls else None
                return weakening, sig, kernel_compile_key(tuned, cfg, sig, arch,
                                                          self.toolchain_fp or "", exact)
            if len(self._candidates) >= MAX_CANDIDATE_LISTS:
                self._candidates.clear()
            found = self._candidates[memo] = _Candidates(
                lattice(dynamic_patterns(tuned, cfg)), make)
        return iter(found)

    def covering(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str,
                 text: str | None = None) -> tuple[str, str] | None:
        """(class, compile key) of the most specialised cached CUBIN serving this call.

        A found CUBIN is remembered per (kernel, config, signature text, arch): the sizes of a
        `Dim` bucket share a few signatures (their divisibility), so a new size asks the cache
        only when its signature is new. A miss is asked again next time (a CUBIN may land)."""
        if self.toolchain_fp is None or self.store is None:
            return None
        text = text or signature_text(signature)
        memo = _memo_key(tuned, cfg, text, arch)
        found = self._covered.get(memo)
        if found is not None:
            return found
        for weakening, _, key in self.candidates(tuned, cfg, signature, arch, text):
            if self.store.has_compile(key):
                if len(self._covered) >= MAX_CANDIDATE_LISTS:
                    self._covered.clear()
                self._covered[memo] = found = (weakening.cls, key)
                return found
        return None

    def lookup(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str
               ) -> tuple[bytes, str] | None:
        """(cubin, symbol) of the most specialised cached CUBIN serving this launch, or None."""
        found = self.lookup_class(tuned, cfg, signature, arch)
        return None if found is None else found[:2]

    def lookup_class(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str,
                     text: str | None = None) -> tuple[bytes, str, str] | None:
        """(cubin, symbol, class) of the most specialised cached CUBIN serving this launch, or
        None. Never returns a corrupt or foreign one. ``text``: as `candidates`'."""
        if self.toolchain_fp is None or self.store is None:
            return None
        for weakening, sig, key in self.candidates(tuned, cfg, signature, arch, text):
            hit = self.store.get_compile(key)
            if hit is None:
                continue
            symbol = mangled_symbol(sig, tuned.pyfunc.__name__)  # the CUBIN's kernel name
            if hit.symbol != symbol:
                log.warning("%s: cached symbol %s differs from %s; treating as a miss",
                            tuned.name, hit.symbol, symbol)
                continue
            if self.verify is not None and not self.verify(
                    tuned, cfg, sig.with_symbol(symbol), arch, key,
                    getattr(hit, "meta", None) or {}):
                continue
            LEDGER.saved("compile", (getattr(hit, "meta", None) or {}).get("compile_seconds"))
            return hit.cubin, hit.symbol, weakening.cls
        return None


#: The most kernel objects of replaced runtimes `keep_alive` holds (the oldest go first).
MAX_KEPT_ALIVE = 1024
_KEPT_ALIVE: deque[ServedKernel] = deque(maxlen=MAX_KEPT_ALIVE)


def keep_alive(kernels: Iterable[ServedKernel]) -> None:
    """Hold the kernel objects of a runtime that `ctbuild.runtime.reset` or a new context
    replaced, to the process's end: cuTile unloads a kernel object's CUBINs when it is freed,
    and a CUDA graph captured before (``torch.compile``'s reduce-overhead mode) still launches
    them. Freed, its replay ran unloaded code, and its teardown at exit killed the process
    with a segfault (H200, `tests/serve/test_runtime_gpu.py`). Each is detached from its
    context's cache (no runtime calls it again; a new signature would raise): what is held is
    the loaded CUBINs, not the replaced context's store, its open files and its miss policy."""
    for kernel in kernels:
        kernel.source = _DETACHED
        _KEPT_ALIVE.append(kernel)


def _replaced(kernel: ServedKernel, signature: Any, context: Any, arch: str) -> tuple[bytes, str]:
    """The miss handler of a kept-alive kernel: a call that raced the reset asks it for a CUBIN
    it never loaded."""
    raise RuntimeError(f"kernel {kernel.tuned.name!r}: its runtime was replaced "
                       "(ctbuild.runtime.reset or configure) during this call; call it again")


#: The source of every kept-alive kernel: no cache, and a miss says what happened.
_DETACHED = CubinSource(None, None, on_miss=_replaced)


def _memo_key(tuned: TunedKernel, cfg: Config, text: str, arch: str) -> tuple:
    """What `CubinSource`'s memos key a call's lookup by: the kernel (name and fingerprint),
    the config, the exact signature's text and the arch."""
    return (tuned.name, tuned.fingerprint, cfg, text, arch)


class LayoutChanged(Exception):
    """A served kernel pinned to one launch signature was asked for another: the call differs
    from its hot-path entry's in what the key does not hold (base pointer alignment). Nothing
    was launched; the runtime then keys the kernel by pointer alignment too."""


class ServedKernel(ServingKernel):
    """A ``ct.kernel`` for one config of a declared kernel, whose CUBIN comes from the cache.

    Created once per config (or, ``pinned``, per config and signature): cuTile keeps its
    in-memory launch cache per kernel object, so later launches cost only the dispatcher's
    signature check. A pinned kernel serves the first signature it is asked for and refuses
    any other with `LayoutChanged`: every launch it makes is then known to use that one
    signature, whatever the caller looked at.
    """

    def __new__(cls, tuned: TunedKernel, cfg: Config, source: CubinSource,
                pinned: bool = False) -> ServedKernel:
        return ct.kernel.__new__(cls, tuned.pyfunc)

    def __init__(self, tuned: TunedKernel, cfg: Config, source: CubinSource,
                 pinned: bool = False) -> None:
        options = tuned.compiler_options(cfg)
        super().__init__(tuned.pyfunc, num_ctas=options.num_ctas, occupancy=options.occupancy,
                         opt_level=options.opt_level, num_worker_warps=options.num_worker_warps)
        self.tuned, self.config, self.source = tuned, cfg, source
        self.pinned = pinned
        self.pin: str | None = None  # the text of the one signature it serves
        self._pin_lock = threading.Lock()

    def serve(self, signature: Any, context: Any, arch: Arch) -> tuple[bytes, str]:
        """The most specialised cached CUBIN covering the launch, else the miss handler's."""
        text = signature_text(signature)  # the pin and the lookup's memo both key by it
        if self.pinned:
            self._check_pin(signature, text)
        with LEDGER.first("cubin_load"):
            found = self.source.lookup_class(self.tuned, self.config, signature, str(arch),
                                             text)
        if found is not None:
            cubin, symbol, cls = found
            STATS.add(hits=1, **{cls: 1})
            LAST_SERVED.cls = cls
            return cubin, symbol
        STATS.add(misses=1)
        LAST_SERVED.cls = "jit"
        if self.source.on_miss is None:
            raise LookupError(
                f"kernel {self.tuned.name!r} config {self.config!r}: no CUBIN in the cache for "
                f"{arch} and this signature")
        return self.source.on_miss(self, signature, context, str(arch))

    def _check_pin(self, signature: Any, text: str) -> None:
        """Pin on the first signature (``text``: its `signature_text`); raise `LayoutChanged`
        for any other."""
        with self._pin_lock:
            if self.pin is None:
                self.pin = text
                return
            if text == self.pin:
                return
        name = self.tuned.pyfunc.__name__
        raise LayoutChanged(f"kernel {self.tuned.name!r}: launch signature "
                            f"{signature.with_mangled_symbol(name).symbol} differs from the "
                            f"pinned one ({self.pin})")

    def jit_compile(self, signature: Any, context: Any, arch: str) -> tuple[bytes, str]:
        """Compile with cuTile's own path (tileiras); counted in ``STATS.jit_compiles``."""
        try:
            cubin, symbol, lifecycle = self.compile_with_cutile(signature, context, Arch(arch))
        except FileNotFoundError as exc:  # a serving image without tileiras
            STATS.add(jit_failures=1)
            from .miss_policy import CacheMissError
            raise CacheMissError(
                f"ctbuild: kernel {self.tuned.name!r} config {self.config.to_json()} on {arch}: "
                f"no cached CUBIN covers this call and it cannot be JIT-compiled here ({exc}); "
                "add the workload to workloads=[...] (or record misses with CTBUILD_RECORD and "
                "use `ctbuild precompile --from-record`) and rebuild the cache",
                kernel=self.tuned.name, what="cubin", key="", arch=arch) from None
        except BaseException:
            STATS.add(jit_failures=1)
            raise
        STATS.add(jit_compiles=1)
        if lifecycle:
            raise RuntimeError(f"kernel {self.tuned.name!r} links cuTile library modules, "
                               "which ctbuild cannot serve from its cache yet")
        return cubin, symbol

    def replace_hints(self, **hints: Any) -> ServedKernel:
        """cuTile's tuner calls this for every config; keep serving from the cache."""
        if not hints:
            return self
        cfg = Config({**self.config.to_json(), **hints}, self.tuned.name)
        return ServedKernel(self.tuned, cfg, self.source)
