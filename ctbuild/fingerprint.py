"""Kernel fingerprints: exactly what cuTile's front end compiles, and nothing else.

The fingerprint covers the normalized code (an AST dump without line numbers, comments,
docstrings or decorators) of the kernel and of every function it calls, transitively, from any
module that is not a library, plus the value of every global, closure variable and default
argument that code reads, of any type. A value that has no stable text (its repr carries a
memory address) is refused with `FingerprintError` rather than skipped: a skipped value is a
stale CUBIN waiting to be served.

Classes are followed too: ``C.F`` records that attribute (a static or class method, a property
is followed as a function), a class used as a value (``Params()`` in the kernel, a class handed
to a helper, the class of a class method reached) records every attribute it defines and its
dataclass field defaults, and a dataclass instance records every field, shown or not. A name
the kernel takes from builtins is recorded when it is not the interpreter's own builtin.

A module is a library by where its file lives (the standard library's directory,
site-packages, ctbuild's own packages, a distribution ``pip install --target`` put on the
path), never by its name: a project's ``profile.py`` or
``mathx.py`` is followed like any project module.

The decorators are left out on purpose: ``@ctbuild.autotune(...)`` decides which CUBINs are
needed, not what a CUBIN is, and ``@ct.kernel(...)``'s options reach the compile key as hints.
Nothing path-dependent goes in, so moving a checkout keeps every key.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import enum
import functools
import importlib.util
import inspect
import json
import linecache
import os
import re
import sys
import textwrap
import threading
import types
from typing import Any

import xxhash

from . import cutile
from .user_code import LIBRARY_DIRS, OWN_DIRS, installed_file

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
_MISSING = object()


class FingerprintError(ValueError):
    """Something a kernel reads has no stable identity, so no safe cache key exists."""


@functools.lru_cache(maxsize=4096)
def _library_file(path: str) -> bool:
    """Whether a module file lives in a library's directory (stdlib, site-packages, ctbuild, a
    distribution installed in a ``PYTHONPATH`` directory)."""
    real = os.path.realpath(path)
    return real.startswith(LIBRARY_DIRS) or real.startswith(OWN_DIRS) or installed_file(real)


def _module_is_library(module: types.ModuleType) -> bool:
    file = getattr(module, "__file__", None)
    if file is None:
        paths = list(getattr(module, "__path__", None) or ())  # a namespace package
        if paths:
            return _library_file(os.path.join(paths[0], ""))
        spec = getattr(module, "__spec__", None)
        return module.__name__ in sys.builtin_module_names or \
            getattr(spec, "origin", None) in ("built-in", "frozen")
    return _library_file(file)


def is_project_module(module: types.ModuleType) -> bool:
    """Whether a loaded module is the project's (its file is not in a library's directory)."""
    return not _module_is_library(module)


def is_library_module(name: str) -> bool:
    """Whether module ``name`` is a library's, by where its file lives (the loaded module, else
    where an import would find it); a name no import finds is the project's."""
    module = sys.modules.get(name)
    if module is not None:
        return _module_is_library(module)
    try:
        spec = importlib.util.find_spec(name.split(".", 1)[0])
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    where = spec.origin or next(iter(spec.submodule_search_locations or ()), None)
    return where is not None and _library_file(where)


def _is_library(obj: Any) -> bool:
    if isinstance(obj, types.ModuleType):
        return _module_is_library(obj)
    module = getattr(obj, "__module__", None)
    if not module:
        return True
    loaded = sys.modules.get(module)
    return _module_is_library(loaded) if loaded is not None else is_library_module(module)


def _user_class(value: Any) -> bool:
    return isinstance(value, type) and not _is_library(value)


def _user_instance(value: Any) -> bool:
    return not isinstance(value, (type, types.ModuleType, types.FunctionType)) and \
        _user_class(type(value))


def _attr_of(owner: Any, attr: str) -> tuple[Any, bool]:
    """(``owner.attr`` as cuTile's front end reads it, whether it is a function defined on the
    class). A static or class method is its function, a property its getter; on an instance
    no property or descriptor code runs."""
    if isinstance(owner, type):
        found = getattr(owner, attr, _MISSING)
    else:
        try:
            found = inspect.getattr_static(owner, attr)
        except AttributeError:
            return _MISSING, False
        if isinstance(found, (types.MemberDescriptorType, types.GetSetDescriptorType)):
            found = getattr(owner, attr, _MISSING)  # a __slots__ field
    if isinstance(found, (staticmethod, classmethod, types.MethodType)):
        found = found.__func__
    elif isinstance(found, property):
        found = found.fget
    return found, isinstance(found, types.FunctionType)


def _builtin(func: types.FunctionType, name: str) -> Any:
    """What ``name`` means in ``func``'s builtins when it is not the interpreter's own (a value
    a project put there); `_MISSING` for a genuine builtin or an unknown name."""
    space = func.__globals__.get("__builtins__", builtins)
    value = (vars(space) if isinstance(space, types.ModuleType) else space).get(name, _MISSING)
    if value is _MISSING or any(value is c for c in (None, True, False, Ellipsis,
                                                      NotImplemented)):
        return _MISSING
    if callable(value) and _is_library(value):
        return _MISSING
    return value


def _sunder(name: str) -> bool:
    """Python's and enum's own names (``__dict__``, ``_member_map_``), not a class's attributes."""
    return len(name) > 1 and name.startswith("_") and name.endswith("_")


def _unwrap(func: Any) -> Any:
    func = cutile.pyfunc(func)  # ct.kernel objects
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return func


def _children(node: ast.AST) -> list[ast.AST]:
    """A node's child nodes in field order, list items in order (`ast.iter_child_nodes`'s
    order, without its generator: the walks below were most of a fingerprint's time, and the
    fingerprint runs at a kernel's first call)."""
    out: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            out.append(value)
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, ast.AST))
    return out


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _normalize_and_read(tree: ast.AST) -> list[list[str]]:
    """Drop what cannot change compiled code (decorators, docstrings; in place) and return the
    dotted names the rest reads: ``helper``, ``mod.helper``, ``TILE``, ``cfg.X`` (the longest
    chain only: ``C.F`` reads ``C.F``, not all of ``C``).

    One breadth-first walk (`ast.walk`'s order, parents before their children: the order names
    are found in is the order helpers are named in, `_Walk.function_ref`); a node is stripped
    before its children are listed, so a dropped docstring or decorator is never visited. The
    walks were most of a fingerprint's time, and it runs at a kernel's first call."""
    refs = []
    inner: set[int] = set()  # attribute nodes and names inside a longer chain
    todo = [tree]
    i = 0
    while i < len(todo):
        node = todo[i]
        i += 1
        if isinstance(node, _DEFS):
            node.decorator_list = []
            body = node.body
            if body and isinstance(body[0], ast.Expr) and \
                    isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        todo.extend(_children(node))
        if id(node) in inner:
            continue
        chain: list[str] = []
        cur = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
            inner.add(id(cur))
        if isinstance(cur, ast.Name) and (isinstance(node, ast.Name) or chain):
            refs.append([cur.id, *reversed(chain)])
    return refs


def _last_code_line(code: types.CodeType) -> int:
    """The last source line any instruction of ``code`` or of a function nested in it starts
    on (`co_lines`: a tenth of `co_positions`' cost; the lines an expression continues on after
    it are more indented than the ``def``, and `_quick_tree` takes those in)."""
    last = max((line for _, _, line in code.co_lines() if line is not None), default=0)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            last = max(last, _last_code_line(const))
    return last


def _quick_tree(func: types.FunctionType) -> ast.Module | None:
    """The parsed source of a ``def`` as `inspect.getsource` gives it, cut by indentation from
    the code's own line table (inspect tokenizes: ~0.5 ms a function, most of a fingerprint on a
    kernel's first call). None where the cut is not that one whole function (a lambda, a
    signature on its own lines with nothing after it, an unusual layout): then inspect's."""
    code = func.__code__
    linecache.checkcache(code.co_filename)  # the file as it is now, as inspect reads it
    lines = linecache.getlines(code.co_filename, func.__globals__)
    start = code.co_firstlineno - 1
    if not 0 <= start < len(lines):
        return None
    head = lines[start]
    if not head.lstrip().startswith(("def ", "async ", "@")):
        return None
    indent = len(head) - len(head.lstrip())
    end = _last_code_line(code)  # 1-based: lines[start:end] holds every instruction
    if end <= start:
        return None
    for i in range(end, len(lines)):  # code that compiles to nothing (pass, dead branches)
        text = lines[i].lstrip()
        if text and not text.startswith("#"):
            if len(lines[i]) - len(text) <= indent:
                break
            end = i + 1
    try:
        tree = ast.parse(textwrap.dedent("".join(lines[start:end])))
    except SyntaxError:
        return None
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) \
            or body[0].name != code.co_name:
        return None
    return tree


#: `analyse`'s results by code object (its id; the entry holds the code, so the id stays its),
#: at most `MAX_ANALYSED` (a program declaring kernels without end starts over).
_ANALYSED: dict[int, tuple[types.CodeType, str, list[list[str]]]] = {}
_ANALYSED_LOCK = threading.Lock()
MAX_ANALYSED = 4096


def analyse(func: types.FunctionType) -> tuple[str, list[list[str]]]:
    """(the dump of a function's normalized source, the dotted names it reads): the part of a
    fingerprint that depends on the source text alone (parsing it is most of a fingerprint's
    time), computed once per function in a process. A serving process computes it for each
    kernel as it is declared (`prepare`), so the kernel's first call does not; the values the
    names hold are read at the first call, when the kernel's module has run to its end."""
    code = func.__code__
    hit = _ANALYSED.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1], hit[2]
    tree, reads = _code_tree(func)
    found = (code, ast.dump(tree, include_attributes=False), reads)
    with _ANALYSED_LOCK:
        if len(_ANALYSED) >= MAX_ANALYSED:
            _ANALYSED.clear()
        _ANALYSED[id(code)] = found
    return found[1], found[2]


def prepare(kernel: Any) -> None:
    """`analyse` a kernel and the project functions its module defined above it, ahead of its
    first call (at its declaration). Never raises: what fails here fails again, and is
    reported, when the fingerprint is taken."""
    try:
        root = _unwrap(kernel)
        _, reads = analyse(root)
        for chain in reads:
            helper = _unwrap(root.__globals__.get(chain[0]))
            if isinstance(helper, types.FunctionType) and not _is_library(helper):
                analyse(helper)
    except Exception:  # noqa: BLE001 - see the docstring
        pass


def _code_tree(func: types.FunctionType) -> tuple[ast.AST, list[list[str]]]:
    """(the normalized tree of a function's source, the dotted names it reads)."""
    tree = _quick_tree(func)
    if tree is None:
        try:
            source = textwrap.dedent(inspect.getsource(func))
        except (OSError, TypeError) as exc:
            raise FingerprintError(
                f"cannot read the source of {func.__qualname__}: {exc}") from exc
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a lambda in the middle of an expression: keep its own text
            tree = ast.parse(f"({source.strip().rstrip(',')})")
    return tree, _normalize_and_read(tree)


def _locals(code: types.CodeType) -> set[str]:
    names = set(code.co_varnames) | set(code.co_cellvars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _locals(const)
    return names


class _Walk:
    """One fingerprint computation: functions to visit, and the parts collected so far."""

    def __init__(self) -> None:
        self.parts: dict[str, Any] = {}
        self.pending: list[types.FunctionType] = []
        self.names: dict[int, str] = {}
        self.classes: dict[int, str] = {}

    def function_ref(self, func: types.FunctionType) -> str:
        """The function's name in the fingerprint: its discovery order and qualname, not its
        module, which is where the file lives, not what it compiles to."""
        if id(func) not in self.names:
            self.names[id(func)] = f"fn{len(self.names)}:{func.__qualname__}"
            self.pending.append(func)
        return self.names[id(func)]

    def class_ref(self, cls: type) -> str:
        """A project class's name in the fingerprint; the first time, its description (every
        attribute its own classes define, dataclass field defaults) goes into the parts."""
        if id(cls) not in self.classes:
            ref = self.classes[id(cls)] = f"cls{len(self.classes)}:{cls.__qualname__}"
            self.parts[ref] = self.describe_class(cls)
        return self.classes[id(cls)]

    def describe_class(self, cls: type) -> list[Any]:
        out: list[Any] = []
        for klass in cls.__mro__:
            if klass is object or _is_library(klass):
                continue
            attrs = []
            for attr, raw in sorted(vars(klass).items()):
                if _sunder(attr):
                    continue
                if isinstance(raw, (staticmethod, classmethod)):
                    raw = raw.__func__
                elif isinstance(raw, property):
                    raw = raw.fget
                attrs.append([attr, self.soft_value(raw, f"{klass.__qualname__}.{attr}")])
            out.append([klass.__qualname__, attrs])
        if dataclasses.is_dataclass(cls):
            out.append(["fields", [[f.name, self.soft_value(f.default, f.name),
                                    self.soft_value(f.default_factory, f.name)]
                                   for f in dataclasses.fields(cls)]])
        return out

    def soft_value(self, value: Any, where: str) -> Any:
        """`value` for what a class defines whether or not the kernel reads it: one without a
        stable text is described by its type (the kernel's own reads are `value`, strict)."""
        if value is dataclasses.MISSING:
            return ["missing"]
        try:
            return self.value(value, where)
        except FingerprintError:
            cls = type(value)
            return ["unstable", f"{cls.__module__}.{cls.__qualname__}"]

    def value(self, value: Any, where: str) -> Any:
        """A JSON-able, address-free description of ``value`` (functions are followed)."""
        value = _unwrap(value)
        if value is None or isinstance(value, (bool, int, float, str, bytes, complex)):
            return [type(value).__name__, repr(value)]
        if isinstance(value, (tuple, list)):
            return [type(value).__name__, [self.value(v, where) for v in value]]
        if isinstance(value, (set, frozenset)):
            items = [self.value(v, where) for v in value]
            return [type(value).__name__, sorted(items, key=json.dumps)]
        if isinstance(value, dict):
            items = [[self.value(k, where), self.value(v, where)] for k, v in value.items()]
            return ["dict", sorted(items, key=json.dumps)]
        if isinstance(value, enum.Enum):
            cls = type(value)
            return ["enum", f"{cls.__module__}.{cls.__qualname__}", value.name,
                    self.value(value.value, where)]
        if isinstance(value, types.FunctionType):
            if _is_library(value):
                return ["libfn", f"{value.__module__}.{value.__qualname__}"]
            return ["fn", self.function_ref(value)]
        if isinstance(value, types.ModuleType):
            return ["module", value.__name__]
        if isinstance(value, type):
            if not _is_library(value):
                return ["class", self.class_ref(value)]
            return ["type", f"{value.__module__}.{value.__qualname__}"]
        if dataclasses.is_dataclass(value) and _user_instance(value):
            return ["dataclass", self.class_ref(type(value)),
                    [[f.name, self.value(getattr(value, f.name), f"{where}.{f.name}")]
                     for f in dataclasses.fields(value)]]
        if callable(value) and _is_library(value) and not hasattr(value, "__dict__"):
            return ["lib", f"{getattr(value, '__module__', '')}.{getattr(value, '__name__', '')}"]
        text = repr(value)
        if _ADDRESS.search(text):
            raise FingerprintError(
                f"{where} is {text}, which has no stable identity (its text carries a memory "
                "address); make it a plain constant (number, string, tuple, enum, cuTile dtype) "
                "or give its class a __repr__ that shows its value")
        cls = type(value)
        return ["repr", f"{cls.__module__}.{cls.__qualname__}", text]

    def visit(self, func: types.FunctionType) -> None:
        dump, reads = analyse(func)
        name = self.function_ref(func)
        self.parts[name] = dump
        local = _locals(func.__code__)
        freevars = func.__code__.co_freevars
        for i, default in enumerate(func.__defaults__ or ()):
            self.parts[f"{name}:default{i}"] = self.value(default, f"a default of {func.__qualname__}")
        for arg, default in sorted((func.__kwdefaults__ or {}).items()):
            self.parts[f"{name}:default:{arg}"] = self.value(default, f"{func.__qualname__}({arg}=)")
        for chain in reads:
            head = chain[0]
            if head in freevars and func.__closure__:
                try:
                    value = func.__closure__[freevars.index(head)].cell_contents
                except ValueError:  # an empty cell: assigned later in the enclosing scope
                    continue
            elif head in local:
                continue
            elif head in func.__globals__:
                value = func.__globals__[head]
            else:  # a builtin (or a name the front end will reject): only a project's counts
                value = _builtin(func, head)
                if value is _MISSING:
                    continue
            self.read(name, func, head, value, chain[1:])

    def read(self, name: str, func: types.FunctionType, dotted: str, value: Any,
             attrs: list[str]) -> None:
        """Record what ``dotted.attrs...`` is: through project modules, classes and instances
        attribute by attribute, up to a library module or another kind of value."""
        for attr in attrs:
            if isinstance(value, types.ModuleType) and not _is_library(value):
                self.parts[f"{name}:{dotted}"] = ["module", value.__name__]
                value = getattr(value, attr, None)
            elif _user_class(value) or _user_instance(value):
                owner = value if isinstance(value, type) else type(value)
                value, method = _attr_of(value, attr)
                if method:  # its cls./self. reads are invisible here: the whole class counts
                    self.parts[f"{name}:{dotted}:class"] = ["class", self.class_ref(owner)]
                value = None if value is _MISSING else value
            else:
                break
            dotted += "." + attr
        if isinstance(value, types.ModuleType) and _is_library(value):
            return  # ct.load, math.pi: the toolchain's, versioned by its fingerprint
        self.parts[f"{name}:{dotted}"] = self.value(value, f"{dotted} (read by "
                                                           f"{func.__qualname__})")


def kernel_fingerprint(kernel: Any) -> str:
    """xxh3-128 of the kernel's normalized code, its helpers' and every value they read."""
    root = _unwrap(kernel)
    if not isinstance(root, types.FunctionType):
        raise FingerprintError(f"cannot fingerprint {kernel!r}: not a Python function")
    walk = _Walk()
    walk.function_ref(root)
    while walk.pending:
        walk.visit(walk.pending.pop())
    blob = json.dumps(walk.parts, sort_keys=True).encode()
    return xxhash.xxh3_128_hexdigest(blob)


__all__ = ["FingerprintError", "analyse", "is_library_module", "is_project_module",
           "kernel_fingerprint", "prepare"]
