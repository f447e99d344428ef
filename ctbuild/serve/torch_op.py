"""A declared kernel as a PyTorch op (``ctbuild.torch_op``), so that ``torch.compile`` traces
model code that calls it with no graph break and CUDA graphs capture its launches.

The op is registered directly on a ``torch.library.Library`` fragment (define, impl,
register_fake), as vLLM's ``direct_register_custom_op`` does, not with
``torch.library.custom_op``: that one runs Python wrappers around every call, 15-30 us more
per call than the dispatcher alone on a CPU host (``benchmarks/op_registration.py``). The op's
implementation is the kernel itself (in-place form: no frame of ours runs between the
dispatcher and the hot path) or a function generated for its argument names that allocates
the outputs and calls the kernel. torch is imported only when an op is declared: ``import
ctbuild`` stays free of it.
"""
from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ..declaration_checks import arity_problem, did_you_mean
from ..declare import DeclarationError, TunedKernel
from ..specs import Scalar, Tensor

#: Where the op's implementation is registered: every backend, so that a call with host
#: tensors reaches the kernel, which refuses them naming itself. Meta and FakeTensor calls go
#: to the fake implementation instead.
DISPATCH_KEY = "CompositeExplicitAutograd"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: One fragment per namespace, kept for the life of the process: torch drops a fragment's
#: registrations when the fragment is collected.
_LIBRARIES: dict[str, Any] = {}
#: The kernel each op was declared on, by qualified name: a second declaration names it.
_DECLARED: dict[str, TunedKernel] = {}


class OpArguments(SimpleNamespace):
    """An op's arguments by name, as its ``outputs=`` functions get them (``w.X``, ``w["X"]``),
    at every call: made and read in ~0.5 us, where a `Workload` (a dataclass read through
    ``__getattr__``) takes ~2 us."""

    def __getitem__(self, name: str) -> Any:
        return self.__dict__[name]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the op has no argument {name!r} (arguments: "
                             f"{', '.join(self.__dict__)})")


class OpPlan(NamedTuple):
    """What an op is made of: its qualified name, the call arguments it takes (``inputs``, in
    call order) and the ones it allocates and returns (``outputs``, in the order given).
    A NamedTuple: this module is imported by ``import ctbuild`` (docs/architecture.md)."""
    qualname: str
    inputs: tuple[str, ...]
    mutates: tuple[str, ...]
    outputs: dict[str, Callable[[OpArguments], Any]]


def torch_op(kernel: TunedKernel, name: str, *, mutates: Sequence[str] = (),
             outputs: Mapping[str, Callable[[OpArguments], Any]] | None = None) -> Any:
    """Register ``kernel`` as the torch op ``name`` (``"mylib::rmsnorm"``) and return it
    (``torch.ops.mylib.rmsnorm.default``).

    ``mutates``: the call arguments the kernel writes; the caller passes them, the op returns
    nothing for them. ``outputs``: the call arguments the op allocates and returns (in this
    order), each ``alloc(w)`` of the op's own arguments by name (``w.X``); it runs on real
    tensors at a call and on fake ones while tracing, so it reads only shapes, dtypes and
    devices (``lambda w: torch.empty_like(w.X)``). The op's other arguments are the kernel's
    call arguments in call order, typed from the declared workloads. Every mistake is a
    `DeclarationError` naming the kernel."""
    if not isinstance(kernel, TunedKernel):
        raise DeclarationError(f"ctbuild.torch_op({name!r}, ...) takes a @ctbuild.autotune "
                               f"kernel, got {kernel!r}")
    plan = _plan(kernel, name, tuple(mutates), dict(outputs or {}))
    schema = op_schema(kernel, plan)
    _check_outputs(kernel, plan)
    impl = kernel if not plan.outputs else _generated(kernel, plan, launch=True)
    fake = _no_outputs if not plan.outputs else _generated(kernel, plan, launch=False)
    return _register(kernel, plan, schema, impl, fake)


def _plan(kernel: TunedKernel, name: str, mutates: tuple[str, ...],
          outputs: dict[str, Callable[[OpArguments], Any]]) -> OpPlan:
    """The op's parts, once its name and what it writes are checked against the declaration."""
    def problem(message: str) -> DeclarationError:
        return kernel.error(f"torch op {name!r}: {message}")
    namespace, sep, op = name.rpartition("::")
    if not sep:
        raise problem(f"an op name needs a namespace: name it 'mylib::{name}' "
                      f"(then torch.ops.mylib.{name})")
    if not (_IDENTIFIER.fullmatch(namespace) and _IDENTIFIER.fullmatch(op)):
        raise problem("an op name is 'namespace::name', each a Python identifier")
    if not mutates and not outputs:
        raise problem(f"which of its arguments ({', '.join(kernel.params)}) the kernel writes "
                      "cannot be told from its declaration: give mutates=(...) (written in "
                      "place) or outputs={...} (allocated and returned)")
    for what, names in (("mutates", mutates), ("outputs", tuple(outputs))):
        for n in names:
            if n not in kernel.params:
                raise problem(f"{what} names unknown argument {n!r}{_close(n, kernel.params)}"
                              f"; arguments: {', '.join(kernel.params)}")
    if both := sorted(set(mutates) & set(outputs)):
        raise problem(f"{both} are in both mutates and outputs; an argument is either passed "
                      "and written (mutates) or allocated and returned (outputs)")
    written = set(mutates) | set(outputs)
    for what, names in (("restore", kernel.restore), ("reset_to_zero", kernel.reset_to_zero)):
        if unsaid := [n for n in names if n not in written]:
            raise problem(f"the declaration's {what}= says the kernel writes {unsaid}: add "
                          "them to mutates= or outputs=")
    for out, alloc in outputs.items():
        if message := arity_problem(f"outputs[{out!r}]", alloc, (1,), "(w)"):
            raise problem(message)
    inputs = tuple(p for p in kernel.params if p not in outputs)
    return OpPlan(f"{namespace}::{op}", inputs, mutates, outputs)


def _close(name: str, names: Sequence[str]) -> str:
    """`did_you_mean`, first ignoring case: kernels name tensors ``OUT``, callers ``out``."""
    same = [n for n in names if n.lower() == name.lower()]
    return f" (did you mean {same[0]!r}?)" if same else did_you_mean(name, names)


def argument_type(kernel: TunedKernel, op: str, name: str) -> str:
    """The schema type of call argument ``name`` of ``op``, from what every declared workload
    gives it: ``Tensor``; ``bool``; ``float``; ``int`` for a value compiled in (a
    ``ct.Constant``: traced as the constant it is), else ``SymInt`` (a runtime integer may stay
    symbolic)."""
    if not kernel.declared_workloads:
        raise kernel.error(f"torch op {op!r}: an op takes its argument types from the declared "
                           "workloads, and this kernel declares none")
    constant = name in kernel.constant_args()
    kinds = {_kind(w[name], constant) for w in kernel.declared_workloads}
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind is None:
        given = sorted({repr(w[name]) for w in kernel.declared_workloads})
        raise kernel.error(f"torch op {op!r}: argument {name!r} is declared as "
                           f"{', '.join(given)}; an op's argument is a Tensor, or a bool, int or "
                           "float (plain or a Scalar), the same in every workload")
    return kind


def _kind(value: Any, constant: bool) -> str | None:
    """The schema type of one declared value (None: no torch op argument can carry it)."""
    if isinstance(value, Tensor):
        return "Tensor"
    dtype = value.dtype if isinstance(value, Scalar) else type(value).__name__
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "int" if constant else "SymInt"
    if dtype.startswith(("float", "bfloat")):
        return "float"
    return None


def op_schema(kernel: TunedKernel, plan: OpPlan) -> str:
    """The schema text ``name(Tensor X, ...) -> ...``: a written tensor is ``Tensor(aN!)`` (its
    own alias set), outputs are returned (one ``Tensor``, a tuple of them, or ``()``)."""
    types = {p: argument_type(kernel, plan.qualname, p) for p in kernel.params}
    for n in (*plan.mutates, *plan.outputs):
        if types[n] != "Tensor":
            raise kernel.error(f"torch op {plan.qualname!r}: {n!r} is written, but the "
                               f"workloads declare it as a {types[n]}, not a Tensor")
    args = []
    for p in plan.inputs:
        alias = f"(a{plan.mutates.index(p)}!)" if p in plan.mutates else ""
        args.append(f"{types[p]}{alias} {p}")
    returns = ["Tensor"] * len(plan.outputs)
    result = returns[0] if len(returns) == 1 else f"({', '.join(returns)})"
    return f"{plan.qualname.partition('::')[2]}({', '.join(args)}) -> {result}"


def _no_outputs(*args: Any) -> None:
    """The fake implementation of an op that only writes its arguments: nothing to make."""


def _generated(kernel: TunedKernel, plan: OpPlan, *, launch: bool) -> Callable[..., Any]:
    """The op's implementation (``launch``) or its fake: allocate each output from the op's
    arguments, then (implementation only) call the kernel with the outputs in their places.
    Generated for the argument names, as the hot path's key functions are: a generic loop
    over names would cost several microseconds per call."""
    position = {p: f"a{i}" for i, p in enumerate(plan.inputs)}
    made = {o: f"o{i}" for i, o in enumerate(plan.outputs)}
    named = ", ".join(f"{p}={a}" for p, a in position.items())
    lines = [f"def op({', '.join(position.values())}):", f"    w = _OpArguments({named})"]
    lines += [f"    {o} = _alloc{i}(w)" for i, o in enumerate(made.values())]
    if launch:
        lines.append(f"    _kernel({', '.join({**position, **made}[p] for p in kernel.params)})")
    names = list(made.values())
    lines.append(f"    return {names[0] if len(names) == 1 else '(' + ', '.join(names) + ')'}")
    namespace: dict[str, Any] = {"_OpArguments": OpArguments, "_kernel": kernel,
                                 **{f"_alloc{i}": f for i, f in enumerate(plan.outputs.values())}}
    exec(compile("\n".join(lines) + "\n", f"<ctbuild op {plan.qualname}>", "exec"), namespace)
    return namespace["op"]


def _check_outputs(kernel: TunedKernel, plan: OpPlan) -> None:
    """Each ``outputs=`` function, run on meta tensors of every declared workload (no memory,
    no device), gives a tensor of the shape and dtype the workload declares for it, on its
    arguments' device: a wrong one fails here, not as a miss or a wrong result at a call."""
    if not plan.outputs:
        return
    import torch
    for w in kernel.workloads:
        meta = OpArguments(**{p: _meta(w[p]) for p in plan.inputs})
        for out, alloc in plan.outputs.items():
            where = f"torch op {plan.qualname!r}: outputs[{out!r}] on workload {w!r}"
            try:
                got = alloc(meta)
            except Exception as exc:
                first = str(exc).splitlines()[0] if str(exc) else ""
                raise kernel.error(f"{where} raised {type(exc).__name__}: {first}") from None
            spec = w[out]
            if not isinstance(got, torch.Tensor) or got.device.type != "meta":
                given = f"a {got.device} tensor" if isinstance(got, torch.Tensor) else \
                    f"a {type(got).__name__}"
                raise kernel.error(f"{where} gave {given}; it must allocate a tensor on its "
                                   "arguments' device (torch.empty_like(w.X), device=w.X.device)")
            if tuple(got.shape) != spec.shape or got.dtype != getattr(torch, spec.dtype):
                raise kernel.error(f"{where} gave {str(got.dtype).removeprefix('torch.')} "
                                   f"{tuple(got.shape)}, where the workload declares {spec!r}")


def _meta(value: Any) -> Any:
    """A declared value as the op receives it: a `Tensor` spec as a meta tensor of its layout,
    a `Scalar` as its example value."""
    import torch
    if isinstance(value, Tensor):
        return torch.empty_strided(value.shape, value.stride(), device="meta",
                                   dtype=getattr(torch, value.dtype))
    return value.value() if isinstance(value, Scalar) else value


def _register(kernel: TunedKernel, plan: OpPlan, schema: str, impl: Callable[..., Any],
              fake: Callable[..., Any]) -> Any:
    """Define the op in its namespace's fragment, with its implementation and its fake."""
    import torch
    namespace, _, op = plan.qualname.partition("::")
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    library = _LIBRARIES[namespace]
    if hasattr(getattr(torch.ops, namespace), op):
        earlier = _DECLARED.get(plan.qualname)
        by = f"on kernel {earlier.name!r} ({earlier.module})" if earlier else "by other code"
        raise kernel.error(f"torch op {plan.qualname!r} is already registered {by}; give this "
                           "op another name")
    try:
        library.define(schema)
    except RuntimeError as exc:
        raise kernel.error(f"torch refused the op's schema {schema!r}: "
                           f"{str(exc).splitlines()[0]}") from None
    _DECLARED[plan.qualname] = kernel
    library.impl(op, impl, DISPATCH_KEY)
    torch.library.register_fake(plan.qualname, fake, lib=library)
    return getattr(getattr(torch.ops, namespace), op).default
