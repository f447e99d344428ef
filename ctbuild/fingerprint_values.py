"""How a kernel fingerprint describes the values kernel code reads: JSON-able and free of
memory addresses, following functions and project classes through the walk that owns it
(`ctbuild.fingerprint`).

A value is described by what cuTile's front end sees of it: a number by its value (a float
subclass whose ``repr`` hides it too), a container item by item, an enum by class, name and
value, a dataclass instance field by field, a function by its code (a ``@ct.function``
wrapper by the function it wraps, as cuTile unwraps it, and no other ``__wrapped__``), a
project class by everything it defines, an instance whose method or property the kernel
reaches by its state. A value without a stable text is refused (`FingerprintError`).
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import re
import types
from typing import Any

from . import cutile
from .fingerprint_libraries import installed_code, is_library, user_instance
from .fingerprint_source import FingerprintError
from .identity_reads import Unfollowed

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
MISSING = object()
#: Values recorded by their type's name and repr; a subclass of one by its base's repr.
_PRIMITIVES = (bool, int, float, complex, str, bytes)


def attr_of(owner: Any, attr: str) -> tuple[Any, bool]:
    """(``owner.attr`` as cuTile's front end reads it, whether it is a function defined on the
    class). A static or class method is its function, a property its getter; on an instance
    no property or descriptor code runs."""
    if isinstance(owner, type):
        found = getattr(owner, attr, MISSING)
    else:
        try:
            found = inspect.getattr_static(owner, attr)
        except AttributeError:
            return MISSING, False
        if isinstance(found, (types.MemberDescriptorType, types.GetSetDescriptorType)):
            found = getattr(owner, attr, MISSING)  # a __slots__ field
    if isinstance(found, (staticmethod, classmethod, types.MethodType)):
        found = found.__func__
    elif isinstance(found, property):
        found = found.fget
    return found, isinstance(found, types.FunctionType)


def _sunder(name: str) -> bool:
    """Python's and enum's own names (``__dict__``, ``_member_map_``), not a class's attributes."""
    return len(name) > 1 and name.startswith("_") and name.endswith("_")


def unwrap(func: Any) -> Any:
    """The function cuTile's front end compiles for ``func``: a ``ct.kernel``'s, a
    ``@ct.function`` wrapper's; any other object as it is (cuTile follows no other
    ``__wrapped__``)."""
    return cutile.tile_function(func)


def _state(obj: Any) -> dict[str, Any]:
    """An instance's attributes: its ``__dict__`` and its ``__slots__`` fields."""
    found = dict(getattr(obj, "__dict__", None) or {})
    for klass in type(obj).__mro__:
        slots = getattr(klass, "__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                found[slot] = getattr(obj, slot)
    return found


class Describer:
    """The value half of one fingerprint walk: the parts collected so far, the project classes
    described, what could not be followed. The walk names functions (`function_ref`)."""

    def __init__(self) -> None:
        self.parts: dict[str, Any] = {}
        self.classes: dict[int, str] = {}
        self.unfollowed = Unfollowed()

    def function_ref(self, func: types.FunctionType) -> str:
        raise NotImplementedError

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
            if klass is object or is_library(klass):
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

    def instance(self, obj: Any, where: str) -> Any:
        """The state of an instance whose method or property the kernel reaches
        (``CFG.scale(x)``: the method reads ``self``'s fields, which no name in the kernel
        shows); one that has no stable description marks the kernel instead."""
        try:
            if dataclasses.is_dataclass(obj):
                return self.value(obj, where)
            return ["instance", self.class_ref(type(obj)),
                    [[k, self.value(v, f"{where}.{k}")] for k, v in sorted(_state(obj).items())]]
        except FingerprintError as exc:
            self.unfollowed.gave_up(f"the state of {where}", str(exc), None)
            return ["unfollowed"]

    def value(self, value: Any, where: str) -> Any:
        """A JSON-able, address-free description of ``value`` (functions are followed)."""
        value = unwrap(value)
        if value is None or type(value) in _PRIMITIVES:
            return [type(value).__name__, repr(value)]
        if isinstance(value, _PRIMITIVES) and not isinstance(value, enum.Enum):
            base = next(b for b in _PRIMITIVES if isinstance(value, b))  # its repr may lie
            return ["subclass", _qualified(type(value)), base.__name__, base.__repr__(value)]
        if isinstance(value, (tuple, list)):
            return [type(value).__name__, [self.value(v, where) for v in value]]
        if isinstance(value, (set, frozenset)):
            items = [self.value(v, where) for v in value]
            return [type(value).__name__, sorted(items, key=json.dumps)]
        if isinstance(value, dict):
            items = [[self.value(k, where), self.value(v, where)] for k, v in value.items()]
            return ["dict", sorted(items, key=json.dumps)]
        if isinstance(value, enum.Enum):
            return ["enum", _qualified(type(value)), value.name, self.value(value.value, where)]
        return self._object(value, where)

    def _object(self, value: Any, where: str) -> Any:
        """`value` for functions, modules, classes, dataclass instances and other objects."""
        if isinstance(value, types.FunctionType):
            if is_library(value) and not installed_code(value):
                return ["libfn", f"{value.__module__}.{value.__qualname__}"]
            return ["fn", self.function_ref(value)]
        if isinstance(value, types.ModuleType):
            return ["module", value.__name__]
        if isinstance(value, type):
            if not is_library(value):
                return ["class", self.class_ref(value)]
            return ["type", _qualified(value)]
        if dataclasses.is_dataclass(value) and user_instance(value):
            return ["dataclass", self.class_ref(type(value)),
                    [[f.name, self.value(getattr(value, f.name), f"{where}.{f.name}")]
                     for f in dataclasses.fields(value)]]
        if callable(value) and is_library(value) and not hasattr(value, "__dict__"):
            return ["lib", f"{getattr(value, '__module__', '')}.{getattr(value, '__name__', '')}"]
        text = repr(value)
        if _ADDRESS.search(text):
            raise FingerprintError(
                f"{where} is {text}, which has no stable identity (its text carries a memory "
                "address); make it a plain constant (number, string, tuple, enum, cuTile dtype) "
                "or give its class a __repr__ that shows its value")
        return ["repr", _qualified(type(value)), text]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


__all__ = ["Describer", "MISSING", "attr_of", "unwrap"]
