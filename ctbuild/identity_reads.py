"""What a kernel's compiled code depends on that its fingerprint cannot follow: the kernels
whose identity therefore rests on their TileIR.

The fingerprint follows code and the values it reads. Some reads it can name but not follow:
``ct.static_eval(os.environ["X"])`` (an environment variable of the compiling process),
``ct.static_eval(open(PATH).read())`` (a data file), ``getattr(module, name)`` with a name that
is not a literal, ``globals()``/``eval``/``importlib.import_module``, installed code it gave up
on (no source, no stable value). An edit there keeps the key while changing the CUBIN, so such
a kernel is *marked*: `ByTileIR` says why ("identity by TileIR: ..."), ``ctbuild plan`` shows
it, a serving process verifies each of its CUBINs by TileIR at the first load
(`ctbuild.serve.ir_verify`), and precompile's check memo keys on what it reads
(`ByTileIR.state`: the variables' values, the files' contents).
"""
from __future__ import annotations

import builtins
import importlib
import io
import json
import os
import pathlib
import sys
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import xxhash

from .fingerprint_source import ArgSpec

#: Objects whose use reads the environment, a file, or a name chosen at run time, by id
#: (each held here, so its id stays its): (the object, what its use does).
_SPECIAL: dict[int, tuple[Any, str]] = {id(o): (o, kind) for o, kind in (
    *((o, "env") for o in (os.environ, os.environb, os.getenv, os.getenvb)),
    *((o, "file") for o in (builtins.open, os.open, os.fdopen, pathlib.Path, pathlib.PurePath,
                            pathlib.PosixPath, io.FileIO, os.listdir, os.scandir, os.stat,
                            os.path.exists, os.path.isfile, os.path.isdir, os.path.getsize,
                            os.path.getmtime)),
    (builtins.getattr, "getattr"), (sys.modules, "sys.modules"),
    *((o, f"{o.__qualname__}()") for o in (globals, vars, eval, exec, __import__, compile)),
    (importlib.import_module, "importlib.import_module()"))}
#: Functions of modules this one does not import, by (module, qualname): what calling one reads.
_SPECIAL_NAMES = {("glob", "glob"): "file", ("glob", "iglob"): "file",
                  **{(m, n): f"{m}.{n}()".replace("_socket", "socket").replace("Random.", "")
                     for m, n in (("subprocess", "run"), ("subprocess", "check_output"),
                                  ("subprocess", "Popen"), ("time", "time"),
                                  ("time", "time_ns"), ("random", "Random.random"),
                                  ("random", "Random.randint"), ("_socket", "gethostname"),
                                  ("platform", "node"))}}
#: A read file hashed for `ByTileIR.state` is read up to this size (a bigger one: its size
#: and modification time stand for it).
MAX_HASHED_FILE = 64 << 20


def special(value: Any, attrs: list[str]) -> str | None:
    """What reading ``value.attrs...`` does when it reads the environment (``env``), a file
    (``file``), an attribute by a computed name (``getattr``) or a name chosen at run time
    (``globals()``, ...); None otherwise. Only modules are looked through (no user code runs)."""
    cur = value
    for attr in [None, *attrs]:
        if attr is not None:
            if not isinstance(cur, types.ModuleType):
                return None
            cur = getattr(cur, attr, None)
        hit = _SPECIAL.get(id(cur))
        if hit is not None and hit[0] is cur:
            return hit[1]
        if callable(cur) and (found := _SPECIAL_NAMES.get(_name_of(cur))) is not None:
            return found
    return None


def _name_of(func: Any) -> tuple[str, str]:
    """(module, qualname) of a function or a bound method (``random.random``'s module is its
    instance's class's)."""
    module = getattr(func, "__module__", None) or type(getattr(func, "__self__", None)).__module__
    return str(module), str(getattr(func, "__qualname__", ""))


def builtin_special(name: str) -> str | None:
    """`special` for a name taken from the interpreter's own builtins (``open``, ``getattr``)."""
    value = vars(builtins).get(name)
    return None if value is None else special(value, [])


class ByTileIR(NamedTuple):
    """Why a kernel's identity rests on its TileIR, and what it reads besides its sources.
    ``complete``: every environment variable and file it reads is named (so `state` can stand
    for them); else nothing can, and every check derives its TileIR again. (A named tuple, not
    a dataclass: this module is imported with ``import ctbuild``, a serving process's start.)"""
    reasons: tuple[str, ...]
    env: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    complete: bool = True

    @property
    def note(self) -> str:
        return "identity by TileIR: " + "; ".join(self.reasons)

    def to_json(self) -> dict[str, Any]:
        return {"reasons": list(self.reasons), "env": list(self.env), "files": list(self.files),
                "complete": self.complete}

    def state(self) -> str | None:
        """A digest of what the kernel reads now (the variables' values, the files' bytes), or
        None where not everything it reads is named."""
        if not self.complete:
            return None
        return xxhash.xxh3_128_hexdigest(json.dumps(
            [[[n, os.environ.get(n)] for n in self.env], [[f, _file_state(f)] for f in self.files]]
        ).encode())


def _file_state(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_HASHED_FILE + 1)
            if len(data) > MAX_HASHED_FILE:
                st = os.fstat(f.fileno())
                return f"large {st.st_size} {st.st_mtime_ns}"
    except OSError as exc:
        return f"unreadable {exc.errno}"
    return xxhash.xxh3_128_hexdigest(data)


class Unfollowed:
    """What one fingerprint walk could not follow, collected as it goes."""

    def __init__(self) -> None:
        self.reasons: dict[str, None] = {}  # ordered, without repeats
        self.env: set[str] = set()
        self.files: set[str] = set()
        self.complete = True

    def use(self, kind: str, where: str, args: list[tuple[ArgSpec, ...]],
            resolve: Callable[[tuple[str, ...]], Any]) -> None:
        """``where`` (a function) reads through a `special` object of ``kind``; ``args``: the
        leading arguments of its calls and subscripts of it, ``resolve`` a chain's value."""
        if kind == "getattr":
            if any(len(a) < 2 or not a[1] or a[1][0] != "str" for a in args):
                self.reasons[f"{where} calls getattr with a name that is not a literal"] = None
            return
        if kind not in ("env", "file"):
            self.reasons[f"{where} calls {kind}"] = None
            return
        names = [_named(a[0] if a else None, resolve) for a in args] or [None]
        for name in names:
            if name is None:
                self.complete = False
                what = "the environment" if kind == "env" else "a file"
                self.reasons[f"{where} reads {what} (named at run time)"] = None
            else:
                (self.env if kind == "env" else self.files).add(name)
                what = "the environment variable" if kind == "env" else "the file"
                self.reasons[f"{where} reads {what} {name}"] = None

    def gave_up(self, what: str, why: str, file: str | None) -> None:
        """The walk could not follow ``what`` (installed code, an instance): its ``file``, when
        known, stands for it in `ByTileIR.state`."""
        self.reasons[f"{what} cannot be followed ({why})"] = None
        if file:
            self.files.add(file)
        else:
            self.complete = False

    def result(self) -> ByTileIR | None:
        if not self.reasons:
            return None
        return ByTileIR(tuple(self.reasons), tuple(sorted(self.env)), tuple(sorted(self.files)),
                        self.complete)


def _named(spec: ArgSpec, resolve: Callable[[tuple[str, ...]], Any]) -> str | None:
    """The variable or file an argument names: a literal, or a dotted name holding a string
    or path now; None when it is computed."""
    if spec is None:
        return None
    if spec[0] == "str":
        return spec[1]
    value = resolve(tuple(spec[1:]))
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    return path if isinstance(path, str) else None


__all__ = ["ByTileIR", "MAX_HASHED_FILE", "Unfollowed", "builtin_special", "special"]
