"""`ctbuild.cutile`: the installed cuda-tile fits every private hook ctbuild uses, and a cuTile
that changed fails with one error naming each changed hook."""
from __future__ import annotations

import subprocess
import sys

import cuda.tile as ct
import cuda.tile._cext as cext
import pytest

from ctbuild import cutile, cutile_fit


def test_installed_cutile_fits_every_hook() -> None:
    assert cutile.problems() == []


def test_every_changed_hook_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def new_compile(self, signature, options, context):  # a reshaped hook
        raise AssertionError("never called")

    monkeypatch.setattr(ct, "__version__", "1.8.0")
    monkeypatch.setattr(ct.kernel, "_compile", new_compile)
    monkeypatch.delattr(cext, "get_driver_version")
    monkeypatch.setitem(cutile_fit.BUILD_NAMES, "cuda.tile._compile", ("compile_tile", "gone_hook"))
    with pytest.raises(cutile.UnsupportedCuTileError) as err:
        cutile.check()
    message = str(err.value)
    for named in ("version 1.8.0", "kernel._compile", "cuda.tile._cext.get_driver_version",
                  "cuda.tile._compile.gone_hook", "cuda-tile[tileiras]>=1.6,<1.8"):
        assert named in message
    assert "compile_tile" not in message  # present hooks are not named


def test_each_series_checks_its_own_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed cuTile's compiler claimed as the other supported series is refused,
    naming the hooks that differ: the series table matches the sources it describes."""
    installed = cutile.version()
    other = "1.7.0" if installed.startswith("1.6.") else "1.6.0"
    monkeypatch.setattr(ct, "__version__", other)
    found = "; ".join(cutile.problems())
    assert "cuda.tile._compile._get_bytecode's result" in found
    if other.startswith("1.7."):
        assert "compile_cubin lacks preview_features=" in found
    monkeypatch.setattr(ct, "__version__", "1.5.0")
    assert cutile.problems()[0] == "version 1.5.0 (ctbuild supports cuda-tile>=1.6,<1.8)"


def test_front_end_extras_are_never_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """tileiras flags a cuda-tile cannot pass (1.6 has no preview features or tile
    libraries) fail before tileiras runs, rather than compile a CUBIN without them."""
    monkeypatch.setattr(ct, "__version__", "1.6.0")
    ir = cutile.FrontEnd(b"", preview_features=("simt",))
    with pytest.raises(cutile.UnsupportedCuTileError, match="cannot pass preview_features"):
        cutile.compile_cubin("/nonexistent.bytecode", None, "sm_90", ir, None)


def test_a_refused_hint_names_the_version() -> None:
    kernel = ct.kernel(cutile_fit._probe)
    with pytest.raises(ValueError, match=rf"num_worker_warps.*cuda-tile {cutile.version()}"):
        cutile.compiler_options(kernel, num_worker_warps=3)


def test_hooks_read_the_kernel() -> None:
    kernel = ct.kernel(cutile_fit._probe)
    assert cutile.pyfunc(kernel) is cutile_fit._probe
    assert cutile.constant_params(kernel) == {"N"}
    assert {"occupancy", "num_ctas"} <= set(vars(cutile.compiler_options(kernel)))


def test_compiles_are_counted_per_thread_by_one_wrapper() -> None:
    """`compiles_in_this_thread` wraps cuTile's ``compile_tile`` once for the process and
    counts each thread's calls apart: another thread's compile is not this one's."""
    import threading

    before = cutile.compiles_in_this_thread()
    cutile.compiles_in_this_thread()  # a second reader installs no second wrapper
    other: list[int] = []

    def compile_elsewhere() -> None:
        start = cutile.compiles_in_this_thread()
        with pytest.raises(TypeError):  # not a function: cuTile refuses it
            cutile.compiler().compile_tile(None, (), "sm_90", None, None)
        other.append(cutile.compiles_in_this_thread() - start)

    thread = threading.Thread(target=compile_elsewhere)
    thread.start()
    thread.join()
    assert other == [1]
    assert cutile.compiles_in_this_thread() == before


COUNT_BEFORE_THE_COMPILER_LOADS = """
import sys
import pytest
from ctbuild import cutile
assert cutile.compiles_in_this_thread() == 0
assert "cuda.tile._compile" not in sys.modules, "counting loaded the compiler"
with pytest.raises(TypeError):  # not a function: cuTile refuses it, after the wrapper counts
    cutile.compiler().compile_tile(None, (), "sm_90", None, None)
print(cutile.compiles_in_this_thread())
"""


def test_counting_begun_before_the_compiler_loads_counts_its_compiles() -> None:
    """In a process that has not loaded cuTile's compiler, counting does not load it (a tune
    that compiles nothing never pays its import), and a compile once it loads is counted."""
    r = subprocess.run([sys.executable, "-c", COUNT_BEFORE_THE_COMPILER_LOADS],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1"]


def test_serving_kernel_serves_through_the_compile_hook() -> None:
    """The dispatcher's ``_compile`` on a `ServingKernel` asks `serve` with the `Arch` of the
    capability it is given, and hands back cuTile's 4-tuple."""
    seen = []

    class Served(cutile.ServingKernel):
        def serve(self, signature, context, arch):
            seen.append((signature, arch))
            return b"cubin", "symbol"

    kernel = Served(cutile_fit._probe)
    cubin, symbol, host, lifecycle = kernel._compile("sig", None, (10, 0))
    assert (cubin, symbol, host) == (b"cubin", "symbol", None)
    assert lifecycle == cutile.series().lifecycle() and not lifecycle  # [] in 1.6, () in 1.7
    assert seen == [("sig", "sm_100")] and seen[0][1].cc == 100


#: Launches a `ServingKernel` twice through the real ``ct.launch`` on the stub libcuda.
STUB_LAUNCH = """
import sys
sys.path.insert(0, {tests!r})
import cuda.tile as ct
import signature_cases as sc
from ctbuild import cutile, cutile_fit
from ctbuild.specs import Tensor

served = []

class Served(cutile.ServingKernel):
    def serve(self, signature, context, arch):
        served.append(str(arch))
        return b"not a real cubin: the stub driver loads anything", "k_one"

spec = Tensor((64,), "float32")
array = sc.FakeCudaArray(spec, sc.fake_pointer(spec, 0), True)
kernel = Served(sc.k_one)
for _ in range(2):
    ct.launch(0, (1, 1, 1), kernel, (array,))
print(served)
"""


def test_dispatcher_takes_what_the_serving_kernel_returns(stub_libcuda_dir) -> None:
    """cuTile's own dispatcher (on the stub libcuda: no GPU) accepts the ``_compile`` result
    of a `ServingKernel` and caches it: the second launch does not ask again. Its fourth item
    is the private detail that differs by version (1.6 refuses a tuple, 1.7 a list)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]  # where signature_cases.py is
    env = {**os.environ, "LD_LIBRARY_PATH": str(stub_libcuda_dir)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = subprocess.run([sys.executable, "-c", STUB_LAUNCH.format(tests=str(tests))],
                         capture_output=True, text=True, env=env, timeout=120,
                         cwd=tests.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['sm_90']"


def test_both_compile_paths_give_a_cubin() -> None:
    """cuTile's own compile (``kernel._compile``, the runtime's JIT) and ctbuild's (the
    anonymized front end, then tileiras) both run on this cuda-tile, with no GPU."""
    from ctbuild.arch import Arch
    from ctbuild.signature import derive_signature
    from ctbuild.specs import Tensor
    from ctbuild.toolchain import compile_environment

    kernel = cutile.ServingKernel(cutile_fit._probe)
    signature = derive_signature(kernel, (Tensor((64,), "float32"), 4))
    signature = signature.with_mangled_symbol("_probe")
    cubin, symbol, lifecycle = kernel.compile_with_cutile(signature, cext.default_tile_context,
                                                          Arch("sm_90"))
    assert cubin[:4] == b"\x7fELF" and symbol == signature.symbol and lifecycle == ()
    with cutile.compiler_lock(), compile_environment():
        ir = cutile.front_end(kernel, signature, "sm_90", cutile.compiler_options(kernel))
    assert ir.bytecode and not (ir.preview_features or ir.linker_inputs or
                                ir.lifecycle_providers)


def test_compiler_hooks_are_checked_at_first_compiler_use(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Import checks only what serving uses (parsing cuTile's compiler sources costs tens of
    ms, which a serving process never needs); the compiler's hooks are checked before the
    compiler is first handed out, and a changed one is refused there."""
    assert "gone_hook" not in "; ".join(cutile.serve_problems())
    monkeypatch.setitem(cutile_fit.BUILD_NAMES, "cuda.tile._compile", ("compile_tile", "gone_hook"))
    cutile_fit.check_build.cache_clear()
    try:
        with pytest.raises(cutile.UnsupportedCuTileError, match="cuda.tile._compile.gone_hook"):
            cutile.compiler()
    finally:
        cutile_fit.check_build.cache_clear()


def test_mangled_symbol_is_cutiles_for_every_example_signature_class() -> None:
    """`cutile.mangled_symbol` (the mangler without its round-trip check) names each example
    kernel's exact, relaxed and generic signatures as ``with_mangled_symbol`` does."""
    from gpu_runtime_examples import host_tensors, load_examples

    from ctbuild.serve.live_args import workload_spec
    from ctbuild.signature import derive_signature
    from ctbuild.signature_classes import dynamic_patterns, lattice, weakened
    checked = 0
    for tuned in load_examples().values():
        w = workload_spec(tuned, tuned.bind(*host_tensors(tuned.workloads[0], values=False)))
        cfg = tuned.default_config(w)
        sig = derive_signature(tuned.kernel, tuned.kernel_args(cfg, w), mangled=False)
        for weakening in lattice(dynamic_patterns(tuned, cfg)):
            weak = weakened(sig, weakening)
            name = tuned.pyfunc.__name__
            assert cutile.mangled_symbol(weak, name) == weak.with_mangled_symbol(name).symbol
            checked += 1
    assert checked >= 12
