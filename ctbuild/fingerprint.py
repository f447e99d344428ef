"""Kernel fingerprints: exactly what cuTile's front end compiles, and nothing else.

The fingerprint covers the normalized code (an AST dump without line numbers, comments,
docstrings or decorators) of the kernel and of every function it calls, transitively, from any
module that is not the toolchain's or the interpreter's, plus the value of every global,
closure variable and default argument that code reads, of any type. A value that has no stable
text (its repr carries a memory address) is refused with `FingerprintError` rather than
skipped: a skipped value is a stale CUBIN waiting to be served.

It follows what cuTile's front end follows, no more and no less: a function a ``@ct.function``
wrapper wraps, but not another ``__wrapped__`` (a user decorator's ``functools.wraps`` wrapper
is compiled as itself: its own code and closure, which reach the helper); ``getattr(X,
"NAME")`` as ``X.NAME``; an installed library's functions by their code
(`ctbuild.fingerprint_libraries`), so a copy over it without a version bump changes the key;
a float (int, str) subclass by its value, whatever its ``repr`` says.

Classes are followed too: ``C.F`` records that attribute (a static or class method, a property
is followed as a function), a class used as a value (``Params()`` in the kernel, a class handed
to a helper, the class of a class method reached) records every attribute it defines and its
dataclass field defaults, a dataclass instance records every field, shown or not, and an
instance whose method or property the kernel reaches (``CFG.scale(x)``) records its state. A
name the kernel takes from builtins is recorded when it is not the interpreter's own builtin.

What it can name but not follow (an environment variable or a file ``static_eval`` reads, a
``getattr`` by a computed name, installed code without a stable text) marks the kernel:
its identity rests on its TileIR (`ctbuild.identity_reads`, `by_tileir`).

The decorators are left out on purpose: ``@ctbuild.autotune(...)`` decides which CUBINs are
needed, not what a CUBIN is, and ``@ct.kernel(...)``'s options reach the compile key as hints.
Nothing path-dependent goes in, so moving a checkout keeps every key.
"""
from __future__ import annotations

import builtins
import json
import threading
import types
from typing import TYPE_CHECKING, Any

import xxhash

from .fingerprint_libraries import (
    installed_code,
    installed_module,
    is_library,
    is_library_module,
    is_project_module,
    user_class,
    user_instance,
)
from .fingerprint_source import FingerprintError, analyse, local_names
from .fingerprint_values import MISSING, Describer, attr_of, unwrap
from .identity_reads import ByTileIR, builtin_special, special

if TYPE_CHECKING:
    from .declare import TunedKernel

#: Functions of installed libraries one walk follows; past this it gives up (marks the kernel).
MAX_INSTALLED = 64
#: What `by_tileir` says of each fingerprint taken in this process (a program fingerprinting
#: without end starts over past `MAX_ANALYSED_KERNELS`).
_BY_TILEIR: dict[str, ByTileIR | None] = {}
_BY_TILEIR_LOCK = threading.Lock()
MAX_ANALYSED_KERNELS = 4096


def _builtin(func: types.FunctionType, name: str) -> Any:
    """What ``name`` means in ``func``'s builtins when it is not the interpreter's own (a value
    a project put there); for the interpreter's own, the object where its use reads the
    environment, a file or a computed name (`ctbuild.identity_reads.special`), else
    `MISSING` (an ordinary builtin, or an unknown name)."""
    space = func.__globals__.get("__builtins__", builtins)
    value = (vars(space) if isinstance(space, types.ModuleType) else space).get(name, MISSING)
    if value is MISSING or any(value is c for c in (None, True, False, Ellipsis,
                                                     NotImplemented)):
        return MISSING
    if callable(value) and is_library(value):
        return value if builtin_special(name) and value is vars(builtins).get(name) else MISSING
    return value


def prepare(kernel: Any) -> None:
    """`analyse` a kernel and the project functions its module defined above it, ahead of its
    first call (at its declaration). Never raises: what fails here fails again, and is
    reported, when the fingerprint is taken."""
    try:
        root = unwrap(kernel)
        for chain in analyse(root).reads:
            helper = unwrap(root.__globals__.get(chain[0]))
            if isinstance(helper, types.FunctionType) and not is_library(helper):
                analyse(helper)
    except Exception:  # noqa: BLE001 - see the docstring
        pass


class _Walk(Describer):
    """One fingerprint computation: functions to visit, and the parts collected so far."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[types.FunctionType] = []
        self.names: dict[int, str] = {}
        self.installed = 0

    def function_ref(self, func: types.FunctionType) -> str:
        """The function's name in the fingerprint: its discovery order and qualname, not its
        module, which is where the file lives, not what it compiles to."""
        if id(func) not in self.names:
            self.names[id(func)] = f"fn{len(self.names)}:{func.__qualname__}"
            if not installed_code(func):
                self.pending.append(func)
            elif self.installed < MAX_INSTALLED:
                self.installed += 1
                self.pending.append(func)
            else:
                self.unfollowed.gave_up(f"installed code {func.__module__}.{func.__qualname__}",
                                        f"more than {MAX_INSTALLED} installed functions",
                                        func.__code__.co_filename)
        return self.names[id(func)]

    def visit_any(self, func: types.FunctionType) -> None:
        """`visit` a function; installed code it cannot follow (no source, a value without a
        stable text) marks the kernel instead of failing it, its file standing for it."""
        if not installed_code(func):
            self.visit(func)
            return
        try:
            self.visit(func)
        except FingerprintError as exc:
            self.unfollowed.gave_up(f"installed code {func.__module__}.{func.__qualname__}",
                                    str(exc), func.__code__.co_filename)

    def visit(self, func: types.FunctionType) -> None:
        found = analyse(func)
        name = self.function_ref(func)
        self.parts[name] = found.dump
        local = local_names(func.__code__)
        for i, default in enumerate(func.__defaults__ or ()):
            self.parts[f"{name}:default{i}"] = self.value(default, f"a default of {func.__qualname__}")
        for arg, default in sorted((func.__kwdefaults__ or {}).items()):
            self.parts[f"{name}:default:{arg}"] = self.value(default, f"{func.__qualname__}({arg}=)")
        uses: dict[tuple[str, ...], list] = {}
        for target, args in found.uses:
            uses.setdefault(target, []).append(args)
        for chain in found.reads:
            value = _lookup(func, chain[0], local)
            if value is not MISSING:
                self.read(name, func, chain, value, uses.get(tuple(chain), []))

    def read(self, name: str, func: types.FunctionType, chain: list[str], value: Any,
             uses: list) -> None:
        """Record what ``chain`` (``value`` its head's) is: through project and installed
        modules, classes and instances attribute by attribute, up to a library module or
        another kind of value. ``uses``: the arguments of its calls and subscripts."""
        dotted, attrs, done, installed = chain[0], chain[1:], 0, False
        for attr in attrs:
            if isinstance(value, types.ModuleType) and (not is_library(value)
                                                        or installed_module(value)):
                self.parts[f"{name}:{dotted}"] = ["module", value.__name__]
                installed = installed or is_library(value)
                value = getattr(value, attr, None)
            elif user_class(value) or user_instance(value):
                owner = value
                value, method = attr_of(owner, attr)
                if method:  # its cls./self. reads are invisible here: the whole class counts
                    cls = owner if isinstance(owner, type) else type(owner)
                    self.parts[f"{name}:{dotted}:class"] = ["class", self.class_ref(cls)]
                    if not isinstance(owner, type):  # and the instance's state
                        self.parts[f"{name}:{dotted}:self"] = self.instance(owner, dotted)
                value = None if value is MISSING else value
            else:
                break
            dotted += "." + attr
            done += 1
        if (kind := special(value, attrs[done:])) is not None:
            self.unfollowed.use(kind, func.__qualname__, uses,
                                lambda names: _resolve(func, names))
            return
        if isinstance(value, types.ModuleType) and is_library(value):
            return  # ct.load, math.pi: the toolchain's, versioned by its fingerprint
        where = f"{dotted} (read by {func.__qualname__})"
        try:
            self.parts[f"{name}:{dotted}"] = self.value(value, where)
        except FingerprintError as exc:
            if not installed:  # the project's own value: refused, so the user can fix it
                raise
            self.unfollowed.gave_up(f"{dotted}, a value of installed code", str(exc), None)


def _lookup(func: types.FunctionType, head: str, local: set[str]) -> Any:
    """What the name ``head`` holds for ``func``: a closure cell, a global, a project's
    builtin (`_builtin`); `MISSING` for a local, an empty cell or the interpreter's own."""
    freevars = func.__code__.co_freevars
    if head in freevars and func.__closure__:
        try:
            return func.__closure__[freevars.index(head)].cell_contents
        except ValueError:  # an empty cell: assigned later in the enclosing scope
            return MISSING
    if head in local:
        return MISSING
    if head in func.__globals__:
        return func.__globals__[head]
    return _builtin(func, head)  # or a name the front end will reject


def _resolve(func: types.FunctionType, names: tuple[str, ...]) -> Any:
    """The value of a dotted name in ``func`` now (what a file or variable argument holds)."""
    value = _lookup(func, names[0], local_names(func.__code__))
    for attr in names[1:]:
        value = getattr(value, attr, None) if isinstance(value, types.ModuleType) else None
    return None if value is MISSING else value


def kernel_identity(kernel: Any) -> tuple[str, ByTileIR | None]:
    """(xxh3-128 of the kernel's normalized code, its helpers' and every value they read;
    why its identity rests on its TileIR, or None where the fingerprint follows everything)."""
    root = unwrap(kernel)
    if not isinstance(root, types.FunctionType):
        raise FingerprintError(f"cannot fingerprint {kernel!r}: not a Python function")
    walk = _Walk()
    walk.function_ref(root)
    while walk.pending:
        walk.visit_any(walk.pending.pop())
    fingerprint = xxhash.xxh3_128_hexdigest(json.dumps(walk.parts, sort_keys=True).encode())
    marks = walk.unfollowed.result()
    with _BY_TILEIR_LOCK:
        if len(_BY_TILEIR) >= MAX_ANALYSED_KERNELS:
            _BY_TILEIR.clear()
        _BY_TILEIR[fingerprint] = marks
    return fingerprint, marks


def kernel_fingerprint(kernel: Any) -> str:
    """xxh3-128 of the kernel's normalized code, its helpers' and every value they read."""
    return kernel_identity(kernel)[0]


def by_tileir(tuned: TunedKernel) -> ByTileIR | None:
    """Why a declared kernel's identity rests on its TileIR (None: its fingerprint follows
    everything its compiled code depends on). Costs a dictionary lookup once its fingerprint
    was taken in this process."""
    fingerprint = tuned.fingerprint
    found = _BY_TILEIR.get(fingerprint, MISSING)
    if found is MISSING:
        return kernel_identity(tuned.kernel)[1]
    return found  # type: ignore[return-value]


__all__ = ["ByTileIR", "FingerprintError", "analyse", "by_tileir", "is_library_module",
           "is_project_module", "kernel_fingerprint", "kernel_identity", "prepare"]
