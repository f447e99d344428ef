"""The hot path's two forms (`hot_path`), on a CPU with the launch stubbed: the C form finds a
call's entry by its exact layout with no key lookup whatever the call before was, the Python
form by its key; neither ever serves a layout with another layout's entry."""
from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import cuda.tile as ct  # noqa: E402
from conftest import can_build_c, count_slow_calls  # noqa: E402
from gpu_runtime_examples import host_tensors, load_examples  # noqa: E402

from ctbuild.serve import layout_guard  # noqa: E402
from ctbuild.serve.layout_guard import guard_plan, new_table  # noqa: E402
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
    args = host_tensors(tuned.workloads[0], values=False)  # the stubbed launch reads none
    tuned(*args)
    lookups: list[int] = []
    rt._fast = _CountingDict(rt._fast, lookups)
    return tuned, rt, args, slow, lookups


@pytest.fixture(params=["C", "Python"])
def form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each test runs with the C form (where it is built) and with the Python form."""
    monkeypatch.setenv("CTBUILD_NATIVE_GUARD", "1" if request.param == "C" else "0")
    layout_guard.native_guard.cache_clear()
    if layout_guard.kind() != request.param:
        pytest.skip(f"the {request.param} form is not available here")
    yield request.param
    layout_guard.native_guard.cache_clear()


def _c_only() -> None:
    if layout_guard.kind() != "C":
        pytest.skip("the C module is not built here")


def test_the_c_guard_is_built_where_a_c_compiler_is() -> None:
    """`pip install` builds the C guard wherever a C compiler and Python's headers are (as on
    this machine): a broken build must not pass unnoticed as the slower fallback."""
    if not can_build_c():
        pytest.skip("no C compiler or no Python headers here")
    if os.environ.get("CTBUILD_NATIVE_GUARD") == "0":
        pytest.skip("CTBUILD_NATIVE_GUARD=0 turns the C guard off in this run")
    assert layout_guard.native_guard() is not None, "the C guard was not built: pip install -e ."


def test_a_table_tells_exact_layouts_apart() -> None:
    _c_only()
    x = torch.zeros(4, 8, dtype=torch.float16)
    plan = guard_plan((x, 1e-6, None, True))
    assert plan == ((0,), (1, 2, 3))
    assert guard_plan((x, (1, 2))) is None and guard_plan((1.0, 2)) is None
    table = new_table((x, 1e-6), ((0,), (1,)))
    hot = table.add((x, 1e-6), "entry", (1,), "kernel", (), 0)
    assert len(table) == 1 and hot.entry == "entry" and hot.calls == 0
    assert table.add((torch.ones(4, 8, dtype=torch.float16), 1e-6), "other", (1,), "k", (), 0) \
        is hot  # the same layout: the entry already there
    assert table.find(torch.ones(4, 8, dtype=torch.float16), 1e-6) is hot
    others = [torch.zeros(4, 9, dtype=torch.float16), torch.zeros(4, 8),
              torch.zeros(8, 4, dtype=torch.float16).t(),
              torch.zeros(4, 16, dtype=torch.float16)[:, :8], torch.zeros(1, 4, 8)]
    assert not any(table.find(o, 1e-6) for o in others)
    assert not any(table.find(x, eps) for eps in (1e-5, 1, True, None))
    assert table.find(x) is None and table.find(x, 1e-6, 1e-6) is None and \
        table.find(1e-6, x) is None
    sizes = [torch.zeros(n, 8, dtype=torch.float16) for n in range(5, 69)]
    slots = [table.add((t, 1e-6), n, (n,), "kernel", (), 0) for n, t in enumerate(sizes)]
    assert [table.find(t, 1e-6) for t in sizes] == slots and len(table) == 65
    table.clear()
    assert len(table) == 0 and table.find(x, 1e-6) is None


def test_a_tensor_dlpack_cannot_describe_is_another_layout() -> None:
    """A tensor on the meta device: no table for such calls, and a call with one finds no
    entry (refused, not raised)."""
    _c_only()
    x = torch.zeros(4, 8)
    table = new_table((x,), ((0,), ()))
    table.add((x,), "entry", (1,), "kernel", (), 0)
    assert table.find(torch.zeros(4, 8, device="meta")) is None
    assert new_table((torch.zeros(4, 8, device="meta"),), ((0,), ())) is None


def test_a_repeated_layout_skips_the_key_lookup(stub_gpu: list[tuple],
                                                monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """The C form finds calls of a served layout with no key lookup, whichever layout came
    before; the Python form looks a call's key up unless it equals the last entry's key."""
    launches = stub_gpu
    tuned, rt, args, slow, lookups = _warm("rmsnorm", monkeypatch)
    for _ in range(3):  # new tensors, the same layout
        tuned(*host_tensors(tuned.workloads[0], values=False))
    tuned.launch(0, *args)
    assert len(lookups) == (0 if form == "C" else 1) and len(slow) == 1
    tuned(args[0], args[1], args[2], 1e-5)  # another eps: a new entry
    assert len(slow) == 2
    before = len(lookups)
    for _ in range(2):
        tuned(*args)  # back to the first entry (still the Python form's last), then again
        tuned(args[0], args[1], args[2], 1e-5)
    assert len(lookups) - before == (0 if form == "C" else 3) and len(slow) == 2
    assert [la[3][3] for la in launches] == [1e-6] * 5 + [1e-5, 1e-6, 1e-5, 1e-6, 1e-5]
    assert rt.provenance()["launches"] == 10


def test_sizes_that_change_every_call_cost_no_key_lookup(stub_gpu: list[tuple],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """64 row counts cycling, each resolved once: from then on every call is found by its
    exact layout (C form), with its own grid."""
    _c_only()
    tuned, rt, args, slow, lookups = _warm("rmsnorm", monkeypatch)
    x, w, out, eps = args
    calls = [(x[:n], w, out[:n], eps) for n in range(64, 4096, 63)][:64]
    for c in calls:
        tuned(*c)
    assert len(slow) == 1 + 64
    del lookups[:], stub_gpu[:]
    for _ in range(3):
        for c in calls:
            tuned(*c)
    assert lookups == [] and len(slow) == 65
    assert [la[1] for la in stub_gpu] == [(c[0].shape[0],) for c in calls] * 3


def test_the_last_entry_never_serves_another_layout(stub_gpu: list[tuple]) -> None:
    """Shapes, dtypes and strides that differ from the last call's are each launched with
    what resolving them says: their own grid and their own pinned served kernel."""
    launches = stub_gpu
    tuned = KERNELS["matmul"]
    rt = tuned.runtime
    w0, w1 = tuned.workloads[:2]
    def fresh(w: Any) -> tuple:  # new tensors each call; the stubbed launch reads no value
        return host_tensors(w, values=False)

    def transposed_b(a: Any, b: Any, c: Any) -> tuple:
        return a, b.t(), c

    layouts = [
        lambda: fresh(w0),                                         # fp16 4096^3
        lambda: fresh(w1),                                         # bf16 1024 x 8192 x 1024
        lambda: tuple(t.to(torch.bfloat16) for t in fresh(w0)),
        lambda: transposed_b(*fresh(w0)),                          # B transposed
    ]
    expected = []
    for i in [0, 1, 0, 2, 0, 2, 2, 1, 3, 0, 3, 3]:
        args = layouts[i]()
        tuned(*args)
        res = rt.resolve(args, dry=True)
        expected.append((res.grid, rt.resolver.pinned_kernel(res.config, res.signature)))
    assert len(launches) == len(expected)
    for (_, grid, kernel, _), (want_grid, want_kernel) in zip(launches, expected):
        assert grid == want_grid and kernel is want_kernel


def test_a_dropped_memo_is_never_served_from_the_last_entry(
        stub_gpu: list[tuple], monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """Once the memo is dropped (`_retire`: a scalar that varies without bound), no call is
    served by an entry it dropped: the next call resolves again, and every launch is counted."""
    tuned, rt, args, slow, _ = _warm("rmsnorm", monkeypatch)
    tuned(*args)
    with rt._lock:
        rt._retire()
    counted = rt.provenance()["launches"]
    for _ in range(3):
        tuned(*args)
    assert len(slow) == 2 and rt.provenance()["launches"] == counted + 3


def test_threads_alternating_layouts_each_launch_their_own(stub_gpu: list[tuple], form: str) -> None:
    """Four threads call one kernel with four layouts in turn: every launch carries the grid
    and pinned kernel that resolving its own arguments gives, and every launch is counted."""
    import threading
    launches = stub_gpu
    tuned = KERNELS["matmul"]
    rt = tuned.runtime
    w0, w1 = tuned.workloads[:2]
    x0, x1 = host_tensors(w0, values=False), host_tensors(w1, values=False)  # no value read
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


def test_inference_mode_calls_are_the_same_layout(stub_gpu: list[tuple],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The C form compares layouts only: calls inside and outside ``inference_mode`` are one
    entry's, with no key lookup."""
    _c_only()
    tuned, rt, args, slow, lookups = _warm("silu_mul", monkeypatch)
    for _ in range(3):
        tuned(*args)
        with torch.inference_mode():
            tuned(*args)
    entry = dict.get(rt._fast, rt._key(*args))
    assert lookups == [] and len(entry.slots) == 1
    assert entry.launches() == 7 and len(stub_gpu) == 7 and len(slow) == 1


def test_a_call_racing_a_memo_reset_is_counted(stub_gpu: list[tuple],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread drops the memo (`_retire`) while a call the table missed is between its
    key lookup and adding its layout to the table: nothing is added to the new generation, and
    every later call is served and counted."""
    _c_only()
    tuned, rt, args, slow, _ = _warm("rmsnorm", monkeypatch)
    x, w, out, eps = args
    # The same key, but not the table's: a tensor of another type.
    other = (x, torch.nn.Parameter(w, requires_grad=False), out, eps)

    class RetiringDict(dict):
        def __getitem__(self, key: Any) -> Any:
            found = super().__getitem__(key)
            with rt._lock:
                rt._retire()
            return found

    rt._fast = RetiringDict(rt._fast)
    tuned(*other)  # the key finds the entry; the memo is dropped meanwhile
    counted = rt.provenance()["launches"]
    for _ in range(5):
        tuned(*args)
    assert len(rt._table) == 1 and len(slow) == 2
    assert rt.provenance()["launches"] == counted + 5 and len(stub_gpu) == 7


def test_an_entry_serves_its_layout_with_its_own_constants(stub_gpu: list[tuple],
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          form: str) -> None:
    """A layout's calls, by call and by ``launch``, go to its entry; a scalar of another type
    is another entry."""
    launches = stub_gpu
    tuned, rt, args, slow, lookups = _warm("rmsnorm", monkeypatch)
    entry = dict.get(rt._fast, rt._key(*args))
    tuned(*args)
    tuned.launch(7, *args)
    assert launches[-1][0] == 7 and entry.launches() == 3
    tuned(args[0], args[1], args[2], 1)  # an int eps: another key, another entry
    assert len(slow) == 2
    tuned(*args)
    tuned(*args)
    assert entry.launches() == 5
    assert [type(la[3][3]) for la in launches] == [float] * 3 + [int] + [float] * 2
    assert all(la[1] == (4096,) and la[3][4] == 4096 for la in launches)


def test_keywords_reach_the_entry_by_call_and_by_launch(stub_gpu: list[tuple],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        form: str) -> None:
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
        stub_gpu: list[tuple], monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """A form made with the raw stream getter that cuTile then refuses: the runtime switches
    to stream objects once, makes its form again, and no later call is refused."""
    import ctbuild.serve.kernel_runtime as rtmod
    launches, refused, refusing = stub_gpu, [], []

    def launch(stream: Any, *rest: Any) -> None:
        if refusing and isinstance(stream, int):
            refused.append(stream)
            raise TypeError("launch() expected a stream object")
        launches.append((stream, *rest))

    # Launched with from the first call on (the C form keeps what it was made with).
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
    from ctbuild.compile.job_estimates import tile_volume
    from ctbuild.signature import derive_signature, int_constants

    x = Tensor((256, 256), "float16")
    constants = int_constants(derive_signature(tiled_copy, (x, x, (64, 128), 3)))
    assert constants == [64, 128, 3]
    assert tile_volume({"config": {}, "constants": constants}) == 64 * 128


def test_the_c_call_code_keeps_no_reference_on_any_of_its_paths() -> None:
    """The C call object on its five paths (launch, miss, keywords, launch error, the
    runtime's launch), 2000 times each: no reference to the arguments, the stream or the tail
    is kept or lost."""
    import sys
    _c_only()
    from ctbuild.serve._fast_path import HotCall
    t, eps, stream, tail = torch.zeros(4), 1.5, object(), (object(),)
    seen: list[str] = []
    fail = []

    def launch(s: Any, grid: tuple, kernel: Any, kargs: tuple) -> None:
        assert s is stream and kargs == (t, eps, tail[0])
        if fail:
            raise RuntimeError("launch failed")

    table = new_table((t, eps), ((0,), (1,)))
    slot = table.add((t, eps), "entry", (1,), "kernel", tail, 0)
    hot = HotCall(table, lambda device: stream, launch,
                  lambda s, args: seen.append("miss"),
                  lambda s, args, kwargs: seen.append("keywords"),
                  lambda exc, entry, s, args: seen.append("failed"),
                  lambda entry, s, args: seen.append("runtime"), False)

    def counts() -> list[int]:
        return [sys.getrefcount(o) for o in (t, eps, stream, tail, tail[0])]

    before = counts()
    for _ in range(2000):
        hot(t, eps)
        hot(t, 2.5)
        hot(t, eps=eps)
    fail.append(True)
    for _ in range(2000):
        hot(t, eps)
    table.add((t, 3.5), "entry", (1,), "kernel", None, 0)
    for _ in range(2000):
        hot(t, 3.5)
    table.clear()
    assert counts() == before and slot.calls == 2000
    assert seen == ["miss", "keywords"] * 2000 + ["failed"] * 2000 + ["runtime"] * 2000


def test_an_empty_batch_is_served_with_no_launch(stub_gpu: list[tuple], form: str) -> None:
    """A call whose grid has no block (an empty batch: silu_mul's grid (0,)) is counted but not
    launched, by either form: CUDA refuses a launch of no block; the next full call launches."""
    tuned = KERNELS["silu_mul"]
    empty = torch.empty(0, dtype=torch.float16)
    for _ in range(3):
        tuned(empty, empty, empty)
    assert stub_gpu == [] and tuned.runtime.provenance()["launches"] == 3
    tuned(*host_tensors(tuned.workloads[0]))
    assert len(stub_gpu) == 1 and stub_gpu[0][1] != (0,)
