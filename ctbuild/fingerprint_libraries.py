"""Where a kernel's code lives, as the kernel fingerprint tells it: the project's, an installed
library's, or the toolchain's and the interpreter's.

A module is a library by where its file lives (the standard library's directory,
site-packages, ctbuild's own packages, a distribution ``pip install --target`` put on the
path), never by its name: a project's ``profile.py`` or ``mathx.py`` is followed like any
project module.

Among libraries, the fingerprint follows the code of an *installed* one (a distribution in
site-packages or a ``--target`` tree: a helper library of tile functions) by its content,
because a copy over it without a version bump changes what cuTile compiles. It does not follow
the toolchain's (cuTile, whose version is in the toolchain fingerprint), ctbuild's, or the
interpreter's (the standard library, which differs between Python versions that compile to
the same SASS).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import cuda.tile as ct

from .user_code import LIBRARY_DIRS, OWN_DIRS, installed_file

#: The interpreter's own library directories, and cuTile's package: code the fingerprint
#: never follows (the toolchain fingerprint and the Python-neutral key stand for it).
OPAQUE_DIRS = tuple(sorted({str(Path(p).resolve()) + os.sep for p in (
    *(p for key, p in sysconfig.get_paths().items() if key in ("stdlib", "platstdlib")),
    os.path.dirname(ct.__file__))}))


@functools.lru_cache(maxsize=4096)
def _library_file(path: str) -> bool:
    """Whether a module file lives in a library's directory (stdlib, site-packages, ctbuild, a
    distribution installed in a ``PYTHONPATH`` directory)."""
    real = os.path.realpath(path)
    return real.startswith(LIBRARY_DIRS) or real.startswith(OWN_DIRS) or installed_file(real)


@functools.lru_cache(maxsize=4096)
def _opaque_file(path: str) -> bool:
    """Whether a library file is the interpreter's, cuTile's or ctbuild's (never followed)."""
    real = os.path.realpath(path)
    return real.startswith(OPAQUE_DIRS) or real.startswith(OWN_DIRS)


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


def is_library(obj: Any) -> bool:
    """Whether a module, function or class is a library's (by its module's file)."""
    if isinstance(obj, types.ModuleType):
        return _module_is_library(obj)
    module = getattr(obj, "__module__", None)
    if not module:
        return True
    loaded = sys.modules.get(module)
    return _module_is_library(loaded) if loaded is not None else is_library_module(module)


def installed_module(module: types.ModuleType) -> bool:
    """Whether a loaded library module is an installed distribution's whose code the
    fingerprint follows by content (not the interpreter's, cuTile's or ctbuild's)."""
    file = getattr(module, "__file__", None)
    return bool(file) and _module_is_library(module) and not _opaque_file(file)


def installed_code(obj: Any) -> bool:
    """Whether a function (or class) is defined in an `installed_module`."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return module is not None and installed_module(module)


def user_class(value: Any) -> bool:
    """A class the project defines (its attributes are followed)."""
    return isinstance(value, type) and not is_library(value)


def user_instance(value: Any) -> bool:
    """An instance of a class the project defines."""
    return not isinstance(value, (type, types.ModuleType, types.FunctionType)) and \
        user_class(type(value))


__all__ = ["OPAQUE_DIRS", "installed_code", "installed_module", "is_library",
           "is_library_module", "is_project_module", "user_class", "user_instance"]
