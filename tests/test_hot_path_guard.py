"""The hot path asks the entry it served last first (`layout_guard`), on a CPU with the launch
stubbed: a repeated layout skips the key lookup, and no other layout is ever served by it."""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import cuda.tile as ct  # noqa: E402
from conftest import can_build_c, count_slow_calls  # noqa: E402
from gpu_runtime_examples import host_tensors, load_examples  # noqa: E402

from ctbuild.serve import layout_guard  # noqa: E402
from ctbuild.serve.layout_guard import MAX_REGUARDS, guard_plan, make_guard, never  # noqa: E402
from ctbuild.specs import Tensor  # noqa: E402

KERNELS = load_examples()


class _CountingDict(dict):
    """The hot path's memo, counting key lookups."""

    def __init__(self, items: dict, lookups: list[int]) -> None:
        super().__init__(items)
        self.lookups = lookups

    def __getitem__(self, key: Any) -> Any:
        self.lookups.append(1)
        return super().__getitem__(key)


def _warm(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, tuple, list, list]:
    """(kernel, runtime, args, slow calls, key lookups) after one call of its first workload."""
    tuned = KERNELS[name]
    slow = count_slow_calls(tuned, monkeypatch)
    rt = tuned.runtime
    args = host_tensors(tuned.workloads[0])
    tuned(*args)
    lookups: list[int] = []
    rt._fast = _CountingDict(rt._fast, lookups)
    return tuned, rt, args, slow, lookups


@pytest.fixture(params=["C", "torch"])
def guard_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each test runs with the C guard (where it is built) and with torch's guards."""
    monkeypatch.setenv("CTBUILD_NATIVE_GUARD", "1" if request.param == "C" else "0")
    layout_guard.native_guard.cache_clear()
    if layout_guard.kind() != request.param:
        pytest.skip(f"the {request.param} guard is not available here")
    yield request.param
    layout_guard.native_guard.cache_clear()


@pytest.fixture
def torch_guards(monkeypatch: pytest.MonkeyPatch) -> Any:
    """torch's guards, whether or not the C guard is built."""
    monkeypatch.setenv("CTBUILD_NATIVE_GUARD", "0")
    layout_guard.native_guard.cache_clear()
    yield
    layout_guard.native_guard.cache_clear()


def test_the_c_guard_is_built_where_a_c_compiler_is() -> None:
    """`pip install` builds the C guard wherever a C compiler and Python's headers are (as on
    this machine): a broken build must not pass unnoticed as the slower fallback."""
    if not can_build_c():
        pytest.skip("no C compiler or no Python headers here")
    assert layout_guard.native_guard() is not None, "the C guard was not built: pip install -e ."


def test_guards_tell_exact_layouts_apart(guard_kind: str) -> None:
    assert layout_guard.available()
    x = torch.zeros(4, 8, dtype=torch.float16)
    plan = guard_plan((x, 1e-6, None, True))
    assert plan == ((0,), (1, 2, 3))
    assert guard_plan((x, (1, 2))) is None and guard_plan((1.0, 2)) is None
    guard, scalars = make_guard((x,), ((0,), ()))
    assert scalars == () and guard(x) and guard(torch.ones(4, 8, dtype=torch.float16))
    others = [torch.zeros(4, 9, dtype=torch.float16), torch.zeros(4, 8),
              torch.zeros(8, 4, dtype=torch.float16).t(),
              torch.zeros(4, 16, dtype=torch.float16)[:, :8], torch.zeros(1, 4, 8)]
    if guard_kind == "torch":  # torch's guards also check autograd; the key does not
        others.append(torch.zeros(4, 8, dtype=torch.float16, requires_grad=True))
    for other in others:
        assert not guard(other)
    assert not never(x)
    guard, scalars = make_guard((x, 1e-6), ((0,), (1,)))
    if guard_kind == "C":  # one call checks the scalar too
        assert scalars == () and guard(x, 1e-6)
        assert not any(guard(x, eps) for eps in (1e-5, 1, True, None))
        assert not guard(x) and not guard(x, 1e-6, 1e-6) and not guard(1e-6, x)
    else:  # the tensors only; the hot path compares (type, value)
        assert scalars == (float, 1e-6) and guard(x)


def test_the_c_guard_takes_what_it_cannot_describe_as_another_layout(guard_kind: str) -> None:
    """A tensor DLPack cannot describe (on the meta device) gets torch's guards, and a call
    with one is refused, not raised."""
    x = torch.zeros(4, 8)
    guard, _ = make_guard((x,), ((0,), ()))
    assert not guard(torch.zeros(4, 8, device="meta"))
    meta_guard, _ = make_guard((torch.zeros(4, 8, device="meta"),), ((0,), ()))
    assert meta_guard is not never and type(meta_guard) is not layout_guard.native_guard()


def test_a_repeated_layout_skips_the_key_lookup(stub_gpu: list[tuple],
                                                monkeypatch: pytest.MonkeyPatch, guard_kind: str) -> None:
    launches = stub_gpu
    tuned, rt, args, slow, lookups = _warm("rmsnorm", monkeypatch)
    for seed in range(3):  # new tensors, the same layout
        tuned(*host_tensors(tuned.workloads[0], seed=seed))
    tuned.launch(0, *args)
    assert lookups == [] and len(slow) == 1
    tuned(args[0], args[1], args[2], 1e-5)  # another eps: no key either, a new entry
    assert len(slow) == 2 and len(lookups) == 1
    tuned(*args)  # back: the last entry (eps 1e-5) refuses, the key finds the first one
    tuned(*args)  # ... which is asked first now
    assert len(slow) == 2 and len(lookups) == 2
    assert [la[3][3] for la in launches] == [1e-6] * 5 + [1e-5, 1e-6, 1e-6]
    assert rt.provenance()["launches"] == 8


def test_the_last_entry_never_serves_another_layout(stub_gpu: list[tuple]) -> None:
    """Shapes, dtypes and strides that differ from the last call's are each launched with
    what resolving them says: their own grid and their own pinned served kernel."""
    launches = stub_gpu
    tuned = KERNELS["matmul"]
    rt = tuned.runtime
    w0, w1 = tuned.workloads[:2]
    layouts = [
        lambda seed: host_tensors(w0, seed=seed),                  # fp16 4096^3
        lambda seed: host_tensors(w1, seed=seed),                  # bf16 1024 x 8192 x 1024
        lambda seed: tuple(t.to(torch.bfloat16) for t in host_tensors(w0, seed=seed)),
        lambda seed: (host_tensors(w0, seed=seed)[0],              # B transposed
                      host_tensors(w0, seed=seed)[1].t(), host_tensors(w0, seed=seed)[2]),
    ]
    expected = []
    for n, i in enumerate([0, 1, 0, 2, 0, 2, 2, 1, 3, 0, 3, 3]):
        args = layouts[i](n)
        tuned(*args)
        res = rt.resolve(args, dry=True)
        expected.append((res.grid, rt.resolver.pinned_kernel(res.config, res.signature)))
    assert len(launches) == len(expected)
    for (_, grid, kernel, _), (want_grid, want_kernel) in zip(launches, expected):
        assert grid == want_grid and kernel is want_kernel


def test_threads_alternating_layouts_each_launch_their_own(stub_gpu: list[tuple], guard_kind: str) -> None:
    """Four threads call one kernel with four layouts in turn, so the kernel is routed from
    entry to entry under them all the time: every launch still carries the grid and pinned
    kernel that resolving its own arguments gives, and every launch is counted."""
    import threading
    launches = stub_gpu
    tuned = KERNELS["matmul"]
    rt = tuned.runtime
    w0, w1 = tuned.workloads[:2]
    x0, x1 = host_tensors(w0), host_tensors(w1)
    layouts = [x0, x1, tuple(t.to(torch.bfloat16) for t in x0), (x0[0], x0[1].t(), x0[2])]
    expected = {}
    for args in layouts:
        tuned(*args)
        res = rt.resolve(args, dry=True)
        expected[id(args[0]), id(args[1])] = (res.grid, rt.resolver.pinned_kernel(
            res.config, res.signature))
    del launches[:]

    def hammer(offset: int) -> None:
        for n in range(300):
            tuned(*layouts[(n + offset) % len(layouts)])

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(launches) == 1200
    for _, grid, kernel, args in launches:
        assert (grid, kernel) == expected[id(args[0]), id(args[1])]
    assert rt.provenance()["launches"] == 1200 + len(layouts)


def test_a_guard_is_rebuilt_a_few_times_then_dropped(stub_gpu: list[tuple],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     torch_guards: None) -> None:
    """torch's guards (they check dispatch keys): the first call outside ``inference_mode``
    and the rest inside: the key finds the entry its guard refused, the guard is rebuilt once
    and serves from then on; calls alternating between the two modes drop the guard after
    `MAX_REGUARDS` rebuilds."""
    launches = stub_gpu
    tuned, rt, args, slow, lookups = _warm("silu_mul", monkeypatch)
    with torch.inference_mode():
        for _ in range(5):
            tuned(*args)
    entry = dict.get(rt._fast, rt._key(*args))
    assert tuned._call is entry.call and len(lookups) == 1 and entry.reguards == 1 and entry.guard is not never
    for _ in range(MAX_REGUARDS):
        tuned(*args)
        with torch.inference_mode():
            tuned(*args)
    assert entry.guard is never and entry.reguards == MAX_REGUARDS + 1
    assert len(slow) == 1 and len(launches) == 6 + 2 * MAX_REGUARDS
    assert rt.provenance()["launches"] == len(launches)


def test_the_c_guard_serves_inference_mode_calls_without_rebuilding(
        stub_gpu: list[tuple], monkeypatch: pytest.MonkeyPatch) -> None:
    """The C guard checks layouts only: calls inside and outside ``inference_mode`` are one
    entry's own, with no key lookup and no rebuilt guard."""
    if layout_guard.kind() != "C":
        pytest.skip("the C guard is not built here")
    tuned, rt, args, slow, lookups = _warm("silu_mul", monkeypatch)
    for _ in range(3):
        tuned(*args)
        with torch.inference_mode():
            tuned(*args)
    entry = dict.get(rt._fast, rt._key(*args))
    assert lookups == [] and entry.reguards == 0 and tuned._call is entry.call
    assert entry.launches() == 7 and len(stub_gpu) == 7 and len(slow) == 1


def test_a_call_racing_a_memo_reset_leaves_no_stale_last_entry(
        stub_gpu: list[tuple], monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread drops the memo (`_retire`) while a call is between its key lookup and
    noting the entry it found: the note goes to the old generation's cell, so later calls are
    served from the new memo and counted (not by the dropped entry)."""
    tuned, rt, args, slow, _ = _warm("rmsnorm", monkeypatch)
    tuned(args[0], args[1], args[2], 1e-5)  # the last entry is now another one

    class RetiringDict(dict):
        def __getitem__(self, key: Any) -> Any:
            found = super().__getitem__(key)
            with rt._lock:
                rt._retire()
            return found

    rt._fast = RetiringDict(rt._fast)
    tuned(*args)  # the key finds the first entry; the memo is dropped meanwhile
    counted = rt.provenance()["launches"]
    for _ in range(5):
        tuned(*args)
    assert tuned._call in [e.call for e in rt._fast.values()] and len(slow) == 3
    assert rt.provenance()["launches"] == counted + 5 and len(stub_gpu) == 8


def test_an_entry_serves_its_layout_with_its_own_constants(stub_gpu: list[tuple],
                                                          monkeypatch: pytest.MonkeyPatch
                                                          , guard_kind: str) -> None:
    """Once served, a layout's calls go to its entry's own functions (by call and by
    ``launch``); a scalar of another type leaves them for the key and another entry."""
    launches = stub_gpu
    tuned, rt, args, slow, lookups = _warm("rmsnorm", monkeypatch)
    entry = dict.get(rt._fast, rt._key(*args))
    assert tuned._call is entry.call and tuned._launch is entry.launch
    tuned(*args)
    tuned.launch(7, *args)
    assert lookups == [] and launches[-1][0] == 7 and entry.launches() == 3
    tuned(args[0], args[1], args[2], 1)  # an int eps: another key, another entry
    assert len(slow) == 2 and tuned._call is not entry.call
    tuned(*args)  # keyed once, then served by its entry again
    tuned(*args)
    assert tuned._call is entry.call and entry.launches() == 5 and len(lookups) == 2
    assert [type(la[3][3]) for la in launches] == [float] * 3 + [int] + [float] * 2


def test_keywords_reach_the_entry_by_call_and_by_launch(stub_gpu: list[tuple],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        guard_kind: str) -> None:
    """Keyword arguments (the stream among them, for ``launch``) are bound and served by the
    layout's entry; a ``launch`` without a stream is a TypeError, launching nothing."""
    launches = stub_gpu
    tuned, rt, args, slow, _ = _warm("rmsnorm", monkeypatch)
    named = dict(zip(tuned.workloads[0], args))
    tuned(**named)
    tuned(args[0], **dict(list(named.items())[1:]))
    tuned.launch(5, **named)
    tuned.launch(stream=6, **named)
    assert len(slow) == 1 and [la[0] for la in launches[-2:]] == [5, 6]
    assert all(la[3] == launches[0][3] for la in launches)
    with pytest.raises(TypeError):
        tuned.launch(**named)
    assert rt.provenance()["launches"] == len(launches) == 5


def test_a_cutile_refusing_raw_stream_handles_gets_stream_objects(
        stub_gpu: list[tuple], monkeypatch: pytest.MonkeyPatch, guard_kind: str) -> None:
    """An entry armed with the raw stream getter that cuTile then refuses: the runtime
    switches to stream objects once, re-arms its entries, and no later call is refused."""
    import ctbuild.serve.kernel_runtime as rtmod
    launches, refused, refusing = stub_gpu, [], []

    def launch(stream: Any, *rest: Any) -> None:
        if refusing and isinstance(stream, int):
            refused.append(stream)
            raise TypeError("launch() expected a stream object")
        launches.append((stream, *rest))

    # Launched with from the first call on (the hot path's code keeps what it was made with).
    monkeypatch.setattr(rtmod.ct, "launch", launch)
    monkeypatch.setattr(rtmod, "current_stream_object", lambda device: "stream object")
    tuned, rt, args, slow, _ = _warm("silu_mul", monkeypatch)
    tuned(*args)  # served by the entry's own code, on the raw handle
    refusing.append(True)  # ... which cuTile now refuses
    for _ in range(4):
        tuned(*args)
    assert len(refused) == 1 and len(slow) == 1
    assert [la[0] for la in launches] == [0, 0] + ["stream object"] * 4
    assert rt.provenance()["launches"] == 6


@ct.kernel
def tiled_copy(X, Y, SHAPE: ct.Constant[tuple], SCALE: ct.Constant[int]):
    """Y = X, one tile of SHAPE (a tile shape passed as one tuple constant)."""
    ct.store(Y, index=(0, 0), tile=ct.load(X, index=(0, 0), shape=SHAPE))


def test_tile_volume_counts_a_tile_shape_passed_as_a_tuple_constant() -> None:
    from ctbuild.build.job_estimates import tile_volume
    from ctbuild.signature import derive_signature, int_constants

    x = Tensor((256, 256), "float16")
    constants = int_constants(derive_signature(tiled_copy, (x, x, (64, 128), 3)))
    assert constants == [64, 128, 3]
    assert tile_volume({"config": {}, "constants": constants}) == 64 * 128


def test_the_c_call_code_keeps_no_reference_on_any_of_its_paths() -> None:
    """The C call object on its four paths (launch, refused, keywords, launch error), 2000
    times each: no reference to the arguments, the stream or the tail is kept or lost."""
    import sys
    if layout_guard.kind() != "C":
        pytest.skip("the C guard is not built here")
    from ctbuild.serve._fast_path import ArmedCall, LayoutCheck
    t, eps, stream, tail = torch.zeros(4), 1.5, object(), (object(),)
    seen: list[str] = []
    fail = []

    def launch(s: Any, grid: tuple, kernel: Any, kargs: tuple) -> None:
        assert s is stream and kargs == (t, eps, tail[0])
        if fail:
            raise RuntimeError("launch failed")

    armed = ArmedCall("entry", LayoutCheck((t, eps), (0,), (1,)), (1,), "kernel", tail, 0,
                      lambda device: stream, launch,
                      lambda args, entry: seen.append("refused"),
                      lambda s, args, kwargs: seen.append("keywords"),
                      lambda exc, entry, s, args: seen.append("failed"), False)

    def counts() -> list[int]:
        return [sys.getrefcount(o) for o in (t, eps, stream, tail, tail[0])]

    before = counts()
    for _ in range(2000):
        armed(t, eps)
        armed(t, 2.5)
        armed(t, eps=eps)
    fail.append(True)
    for _ in range(2000):
        armed(t, eps)
    assert counts() == before and armed.calls == 2000
    assert seen == ["refused", "keywords"] * 2000 + ["failed"] * 2000
