"""What ``inputs=`` and ``check=`` declare: the values tuning runs a kernel on, and the
reference its correctness gate compares with.

Both are checked when the kernel is declared, so a mistake ends at ``ctbuild plan`` (one line,
exit 2) instead of in the middle of a tune on a GPU. The tuner reads them
(`ctbuild.tune.inputs` makes the tensors, `ctbuild.tune.check` compares the outputs); nothing
here needs torch.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from .declaration_checks import arity_problem, did_you_mean
from .specs import DTYPE_BITS, Scalar, Tensor, Workload

if TYPE_CHECKING:
    from .declare import DeclarationError, TunedKernel

#: ``fn(w, device)``: builds one argument (per-argument form) or several (a mapping).
Maker = Callable[[Workload, Any], Any]


class ValueRange(NamedTuple):
    """Values drawn uniformly: whole numbers ``lo..hi`` (both ends included) when both bounds
    are ints, else real numbers in ``[lo, hi)``."""
    lo: float
    hi: float

    @property
    def integer(self) -> bool:
        return isinstance(self.lo, int) and isinstance(self.hi, int)


class TuningInputs(NamedTuple):
    """A kernel's declared ``inputs=``: per-argument ranges and functions, or one function
    that builds several arguments from the workload. A NamedTuple: made at import."""
    ranges: dict[str, ValueRange]
    makers: dict[str, Maker]
    build: Maker | None

    def covers(self, name: str) -> bool:
        """Whether tuning takes ``name``'s values from the declaration (a whole-workload
        function may build any argument: it is trusted to build the ones that matter)."""
        return self.build is not None or name in self.ranges or name in self.makers


NO_INPUTS = TuningInputs({}, {}, None)

_SHAPE = "(w, device)"


def is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def int_limits(dtype: str) -> tuple[int, int]:
    """The values an integer dtype holds (capped where torch's int64 generator ends)."""
    bits = DTYPE_BITS[dtype]
    if dtype.startswith("uint"):
        return 0, min(2**bits - 1, 2**63 - 2)
    return -(2 ** (bits - 1)), min(2 ** (bits - 1) - 1, 2**63 - 2)


def declared_inputs(inputs: Any, params: Sequence[str], workloads: Iterable[Workload],
                    error: Callable[[str], DeclarationError]) -> TuningInputs:
    """``inputs=`` checked against the call arguments and every declared workload."""
    if inputs is None:
        return NO_INPUTS
    if callable(inputs):
        if problem := arity_problem("inputs", inputs, (2,), _SHAPE):
            raise error(problem)
        return TuningInputs({}, {}, inputs)
    if not isinstance(inputs, Mapping):
        raise error(f"inputs= must be a mapping of argument name -> (lo, hi) range or function "
                    f"{_SHAPE}, or one function {_SHAPE} -> mapping; got {inputs!r}")
    ranges: dict[str, ValueRange] = {}
    makers: dict[str, Maker] = {}
    workloads = list(workloads)
    for name, value in inputs.items():
        if name not in params:
            raise error(f"inputs= names unknown argument {name!r}"
                        f"{did_you_mean(str(name), params)}; arguments: {', '.join(params)}")
        if callable(value):
            if problem := arity_problem(f"inputs[{name!r}]", value, (2,), _SHAPE):
                raise error(problem)
            makers[name] = value
        else:
            ranges[name] = _range(name, value, [w[name] for w in workloads], error)
    return TuningInputs(ranges, makers, None)


def _range(name: str, value: Any, specs: list[Any], error: Callable[[str], DeclarationError]
           ) -> ValueRange:
    """One argument's ``(lo, hi)``, fit for what every workload passes there."""
    bounds = tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(bounds) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                   and math.isfinite(b) for b in bounds):
        raise error(f"inputs[{name!r}] must be a (lo, hi) pair of finite numbers or a function "
                    f"{_SHAPE}; got {value!r}")
    rng = ValueRange(*bounds)
    if rng.lo > rng.hi:
        raise error(f"inputs[{name!r}] = {value!r}: lo is above hi")
    for spec in specs:
        if not isinstance(spec, (Tensor, Scalar)):
            raise error(f"inputs[{name!r}]: a range needs a Tensor or Scalar argument, but a "
                        f"workload passes {spec!r} (give a function {_SHAPE} instead)")
        if spec.dtype == "bool":
            raise error(f"inputs[{name!r}]: {spec.dtype} takes no range; give a function "
                        f"{_SHAPE}")
        if is_integer(spec.dtype):
            lo, hi = int_limits(spec.dtype)
            if not rng.integer:
                raise error(f"inputs[{name!r}] = {value!r}: {name} is {spec.dtype}; give int "
                            "bounds")
            if rng.lo < lo or rng.hi > hi:
                raise error(f"inputs[{name!r}] = {value!r} is outside {spec.dtype}'s "
                            f"{lo}..{hi}")
    return rng


def declared_check(check: Any, error: Callable[[str], DeclarationError]
                   ) -> Callable[[Workload], Mapping[str, Any]] | None:
    """``check=``: None, or a reference function ``check(w) -> {argument: expected}``."""
    if check is not None and (problem := arity_problem(
            "check", check, (1,), "(w) -> {argument name: expected value}")):
        raise error(problem)
    return check


def unset_integer_args(tuned: TunedKernel) -> list[str]:
    """The integer tensor arguments tuning fills by the default rule, in call order: those no
    ``inputs=`` covers (`ctbuild plan` names them)."""
    def integer_tensor(value: Any) -> bool:
        return isinstance(value, Tensor) and is_integer(value.dtype)
    return [name for name in tuned.params if not tuned.inputs.covers(name)
            and any(integer_tensor(w[name]) for w in tuned.declared_workloads)]
