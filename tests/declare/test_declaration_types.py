"""A declaration argument of the wrong type is one `DeclarationError` naming the argument, the
type given and the one expected (it was a bare Python error, or was taken silently); a single
name given as a str where names are expected is that name, not its letters."""
from __future__ import annotations

from typing import Any

import cuda.tile as ct
import pytest

import ctbuild
from ctbuild import Configs, Product, Tensor
from ctbuild.declare import DeclarationError

WORKLOAD = {"X": Tensor((64, 64), "float16"), "OUT": Tensor((64, 64), "float16")}


def declare(**kw: Any) -> ctbuild.declare.TunedKernel:
    """A two-argument kernel (X, OUT) with a TILE axis, declared with ``kw`` over the defaults."""
    @ctbuild.autotune(**{"space": {"TILE": [16, 32]}, "grid": lambda cfg, w: (1,),
                         "workloads": [WORKLOAD], "name": f"types{id(kw)}", **kw})
    @ct.kernel
    def k(X, OUT, TILE: ct.Constant[int]):
        ct.store(OUT, index=(0, 0), tile=ct.load(X, index=(0, 0), shape=(TILE, TILE)))
    return k


def test_one_name_as_a_str_is_that_name() -> None:
    k = declare(restore="OUT", reset_to_zero="OUT")
    assert k.restore == ("OUT",) and k.reset_to_zero == ("OUT",)
    assert declare(params="X", args=lambda cfg, w: (w.X, w.X, cfg.TILE),
                   workloads=[{"X": WORKLOAD["X"]}]).params == ("X",)


MISTAKES = [
    ({"restore": "OUTT"}, "restore= names unknown argument 'OUTT' (did you mean 'OUT'?); "
                          "arguments: X, OUT"),
    ({"reset_to_zero": ["OUT", 3]}, "reset_to_zero= must be an argument name or a tuple of "
                                    "them, got a list ['OUT', 3]"),
    ({"params": ("X", "OUTT")}, "kernel parameter(s) ['OUT'] are neither call arguments nor "
                                "search-space axes; params= names 'OUTT', which is no kernel "
                                "parameter (did you mean 'OUT'?)"),
    ({"workloads": WORKLOAD}, "workloads must be a list of dicts of call arguments, one per "
                              "call, got a dict {'X': Tensor((64, 64), float16), 'OUT': Tensor((64, "
                              "64), ...; put it in a list: workloads=[{...}]"),
    ({"workloads": ["X"]}, "each workload must be a dict of call arguments, got a str 'X'"),
    ({"default": "TILE=16"}, "default must be a dict of axis values (or a function default(w) "
                             "returning one), got a str 'TILE=16'; e.g. default={'TILE': 16}"),
    ({"space": Product(TILE=[16.0, 32.0])}, "axis 'TILE' has the value 16.0 (a float), but "
                                            "the kernel parameter TILE is an int"),
    ({"space": [16, 32]}, "bad search space: Configs takes a list of dicts, one per config, got "
                          "the int 16 in it"),
    ({"space": 16}, "bad search space: the space must be a Product, Configs, a dict of axes or "
                    "a list of configs, got the int 16"),
    ({"cap": "1"}, "cap must be a whole number >= 1 (the most configs per kernel, workload and "
                   "arch), got a str '1'"),
    ({"cap": 1.5}, "cap must be a whole number >= 1 (the most configs per kernel, workload and "
                   "arch), got a float 1.5"),
    ({"cap": True}, "cap must be a whole number >= 1"),
    ({"cap": 0}, "cap must be a whole number >= 1"),
]


@pytest.mark.parametrize("kw,expected", MISTAKES,
                         ids=[f"{i}-{next(iter(kw))}" for i, (kw, _) in enumerate(MISTAKES)])
def test_a_wrong_argument_is_named_with_its_type(kw: dict[str, Any], expected: str) -> None:
    with pytest.raises(DeclarationError) as err:
        declare(**kw)
    assert expected in str(err.value)


def test_a_default_function_returning_no_dict_is_named() -> None:
    k = declare(default=lambda w: "TILE=16")
    with pytest.raises(DeclarationError, match="default must be a dict of axis values .*got a "
                                               "str 'TILE=16'"):
        k.default_config(k.workloads[0])


def test_an_axis_of_floats_is_fine_where_no_int_parameter_takes_it() -> None:
    @ctbuild.autotune(space=Product(TILE=[16], SCALE=[0.5, 2.0]), grid=lambda cfg, w: (1,),
                      workloads=[WORKLOAD], name="float_axis")
    @ct.kernel
    def k(X, OUT, TILE: ct.Constant[int], SCALE: ct.Constant[float]):
        ct.store(OUT, index=(0, 0), tile=ct.load(X, index=(0, 0), shape=(TILE, TILE)) * SCALE)
    assert k.axes == ("TILE", "SCALE")


def test_spaces_of_the_wrong_shape_say_how_to_write_them() -> None:
    with pytest.raises(TypeError, match=r"Product takes axes as keywords \(Product\(TM=\[64, "
                                        r"128\]\)\) and Zip groups, got the dict \{'TILE': "
                                        r"\[16, 32\]\}; write Product\(\*\*\{'TILE': \[16, 32\]\}\)"):
        Product({"TILE": [16, 32]})
    with pytest.raises(TypeError, match="Configs takes a list of dicts, one per config, got "
                                        "the dict"):
        Configs({"TILE": 16})
