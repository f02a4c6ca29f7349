"""PageArena: alignment, page accounting, zero-copy views, the layout rule."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.memory import ARENA_ALIGNMENT, TENSOR_ALIGNMENT, ArenaError, PageArena, layout_tensors

PS = 4096


def test_arena_is_aligned_and_sized():
    a = PageArena(5, PS)
    assert a.address % ARENA_ALIGNMENT == 0
    assert a.buffer.nbytes == 5 * PS
    assert a.page(3).ctypes.data == a.address + 3 * PS


def test_alloc_free_accounting():
    a = PageArena(6, PS)
    p1 = a.alloc(2)
    p2 = a.alloc(3)
    assert sorted(p1 + p2) == [0, 1, 2, 3, 4]
    assert (a.used_pages, a.free_pages) == (5, 1)
    with pytest.raises(ArenaError, match="needs 2 pages, 1 free"):
        a.alloc(2)
    a.free(p1)
    assert a.free_pages == 3
    with pytest.raises(ArenaError, match="already free"):
        a.free(p1)
    with pytest.raises(ArenaError, match="outside"):
        a.free([99])
    p3 = a.alloc(3)
    assert sorted(p3) == [0, 1, 5]
    assert a.free_pages == 0


def test_contiguous_runs_and_fragmentation():
    a = PageArena(6, PS)
    held = a.alloc(6)
    a.free([held[1], held[3], held[4]])  # free: 1, 3, 4
    with pytest.raises(ArenaError, match="contiguous"):
        a.alloc(3, runs=[3])
    assert a.free_pages == 3  # a failed alloc takes nothing
    got = a.alloc(3, runs=[2, 1])
    assert got[:2] == [3, 4] and got[2] == 1


def test_layout_rule():
    offs, pages, runs = layout_tensors([100, 1000, 4000, 10000, 300], PS)
    assert all(o % TENSOR_ALIGNMENT == 0 for o in offs)
    assert offs == [0, 256, PS, 2 * PS, 4 * PS + 2048]
    assert (pages, runs) == (5, [1, 1, 3])
    # no tensor that fits a page straddles a boundary
    for o, n in zip(offs, [100, 1000, 4000, 300], strict=False):
        if n <= PS:
            assert o // PS == (o + n - 1) // PS
    assert layout_tensors([], PS) == ([], 1, [1])


def _blob(tensors, page_size):
    offs, pages, runs = layout_tensors([t.nbytes for t in tensors], page_size)
    blob = np.zeros(pages * page_size, np.uint8)
    for o, t in zip(offs, tensors, strict=True):
        blob[o:o + t.nbytes] = np.frombuffer(t.tobytes(), np.uint8)
    return blob, offs, pages, runs


def test_views_share_memory_and_reload_elsewhere_is_identical():
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal(s).astype(np.float32) for s in [(10,), (30, 20), (3000,), (5,)]]
    blob, offs, pages, runs = _blob(tensors, PS)
    a = PageArena(10, PS)
    a.alloc(1)  # so the first load does not start at page 0
    p1 = a.alloc(pages, runs)
    a.write(p1, blob)
    views = [a.view(p1, o, t.shape, t.dtype) for o, t in zip(offs, tensors, strict=True)]
    for v, t in zip(views, tensors, strict=True):
        np.testing.assert_array_equal(v, t)
        assert np.shares_memory(v, a.buffer)
        assert v.ctypes.data % TENSOR_ALIGNMENT == 0
    views[1][0, 0] = 42.0  # writes through to the arena
    assert a.view(p1, offs[1], (30, 20), np.float32)[0, 0] == 42.0
    # EVICT, then LOAD into different pages
    a.free(p1)
    a.alloc(2)
    p2 = a.alloc(pages, runs)
    assert p2 != p1
    a.write(p2, blob)
    for o, t in zip(offs, tensors, strict=True):
        np.testing.assert_array_equal(a.view(p2, o, t.shape, t.dtype), t)


def test_reload_into_scattered_pages():
    rng = np.random.default_rng(1)
    tensors = [rng.standard_normal(900).astype(np.float32) for _ in range(4)]  # 1 page each
    blob, offs, pages, runs = _blob(tensors, PS)
    assert runs == [1, 1, 1, 1]
    a = PageArena(8, PS)
    first = a.alloc(pages)
    a.write(first, blob)
    a.free(first)
    hold = a.alloc(8)
    a.free([hold[7], hold[5], hold[2], hold[0]])
    second = a.alloc(pages)
    assert set(second) == {0, 2, 5, 7} and second != first
    a.write(second, blob)
    for o, t in zip(offs, tensors, strict=True):
        v = a.view(second, o, t.shape, t.dtype)
        np.testing.assert_array_equal(v, t)


def test_view_rejects_noncontiguous_span():
    a = PageArena(4, PS)
    with pytest.raises(ArenaError, match="not contiguous"):
        a.view([0, 2], 0, (PS // 4 + 1,), np.float32)
    with pytest.raises(ArenaError, match="runs past"):
        a.view([0], 0, (PS,), np.float32)


def _fill(a: PageArena, pages, tag: int) -> None:
    """Each page's bytes say whose page it is and which of its pages (tag, k)."""
    for k, p in enumerate(pages):
        a.page(p)[:] = (tag * 16 + k) % 256


def _holds(a: PageArena, pages, tag: int) -> bool:
    return all((a.page(p) == (tag * 16 + k) % 256).all() for k, p in enumerate(pages))


def test_compact_slides_runs_down_with_their_contents():
    a = PageArena(12, PS)
    x = a.alloc(2)  # 0, 1
    y = a.alloc(4, runs=[3, 1])  # 2..4, 5
    z = a.alloc(3, runs=[3])  # 6..8
    _fill(a, y, 1)
    _fill(a, z, 2)
    a.free(x)
    a.free([y[3]])  # free: 0, 1, 5, 9..11: no 5 contiguous pages
    y = y[:3]
    with pytest.raises(ArenaError, match="contiguous"):
        a.alloc(5, runs=[5])
    moved = a.compact({"y": (y, [3]), "z": (z, [3])})
    assert moved == {"y": [0, 1, 2], "z": [3, 4, 5]}
    assert _holds(a, moved["y"], 1) and _holds(a, moved["z"], 2)
    assert a.free_pages == 6 and a.alloc(6, runs=[6]) == [6, 7, 8, 9, 10, 11]


def test_compact_keeps_pages_nobody_lists_in_place():
    a = PageArena(10, PS)
    x = a.alloc(2)  # 0, 1: freed below
    busy = a.alloc(1)  # 2: an EXEC still reads it
    y = a.alloc(2, runs=[2])  # 3, 4
    gap = a.alloc(1)  # 5: freed below
    z = a.alloc(3, runs=[1, 2])  # 6, 7..8
    _fill(a, busy, 7)
    _fill(a, y, 1)
    _fill(a, z, 2)
    a.free(x)
    a.free(gap)
    moved = a.compact({"y": (y, [2]), "z": (z, [1, 2])})
    # y cannot pass page 2; z slides down to page 5
    assert moved == {"z": [5, 6, 7]}
    assert _holds(a, busy, 7) and _holds(a, y, 1) and _holds(a, moved["z"], 2)
    assert a.alloc(2, runs=[2]) == [0, 1] and a.alloc(2, runs=[2]) == [8, 9]


def test_compact_refuses_pages_that_are_not_the_holders_runs():
    a = PageArena(6, PS)
    y = a.alloc(3, runs=[3])
    z = a.alloc(1)
    for holders in ({"y": (y, [2, 2])},  # runs longer than the pages
                    {"y": ([y[0], y[2], y[1]], [3])},  # a run out of order
                    {"y": (y, [3]), "z": (y[:1], [1])},  # a page listed twice
                    {"w": ([5], [1])}):  # a free page
        with pytest.raises(ArenaError, match="not its own"):
            a.compact(holders)
    assert a.compact({"z": (z, [1])}) == {} and a.free_pages == 2


def test_a_copy_that_fails_leaves_the_moved_pages_told():
    """A copy that fails partway (a device error): ``moved`` holds every holder the page
    table shows elsewhere, so their owners can follow, and no page is owned twice."""

    class Failing(PageArena):
        copies = 0

        def _move(self, src, dst):
            Failing.copies += 1
            if Failing.copies == 3:  # (y's two pages moved; z's first one fails)
                raise RuntimeError("copy failed")
            super()._move(src, dst)

    a = Failing(10, 256)
    x = a.alloc(1)  # 0
    y = a.alloc(2, runs=[2])  # 1, 2
    gap = a.alloc(1)  # 3
    z = a.alloc(2, runs=[2])  # 4, 5
    _fill(a, y, 1)
    _fill(a, z, 2)
    a.free(x)
    a.free(gap)
    moved: dict = {}
    with pytest.raises(RuntimeError, match="copy failed"):
        a.compact({"y": (y, [2]), "z": (z, [2])}, moved)
    assert moved == {"y": [0, 1]}  # z stayed where it was
    assert _holds(a, moved["y"], 1) and _holds(a, z, 2)
    taken = [p for p in range(a.n_pages) if not a._free[p]]
    assert taken == sorted(moved["y"] + z)
    assert not set(a.alloc(a.free_pages)) & set(moved["y"] + z)


def test_a_copy_that_fails_onto_its_own_pages_leaves_the_holder_broken():
    """A run that slides onto part of its own pages, its copy failing partway: its
    contents are partly overwritten, so ``broken`` names it (the page table still shows
    it where it was: its owner must drop it)."""

    class Failing(PageArena):
        def _move(self, src, dst):
            if dst == 2:
                raise RuntimeError("copy failed")
            super()._move(src, dst)

    a = Failing(6, 256)
    x = a.alloc(1)  # 0
    y = a.alloc(4, runs=[4])  # 1..4
    a.free(x)
    moved: dict = {}
    broken: set = set()
    with pytest.raises(RuntimeError, match="copy failed"):
        a.compact({"y": (y, [4])}, moved, broken)
    assert moved == {} and broken == {"y"}
    assert [p for p in range(a.n_pages) if not a._free[p]] == y


@given(ops=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.booleans(),
                              st.booleans()), min_size=1, max_size=14))
@settings(max_examples=150, deadline=None)
def test_compact_after_any_loads_and_evictions(ops):
    """Holders loaded and evicted in any order, some of them pinned where they lie: after
    compact every holder keeps its contents in runs, the pinned pages and contents stay,
    and between two pinned pages the taken ones come first."""
    a = PageArena(24, 256)
    held: dict[int, tuple[list[int], list[int]]] = {}
    pinned: set[int] = set()
    for tag, (n_runs, length, evict, pin) in enumerate(ops):
        runs = [length] * n_runs
        try:
            pages = a.alloc(sum(runs), runs)
        except ArenaError:
            continue
        _fill(a, pages, tag)
        held[tag] = (pages, runs)
        if pin:
            pinned.add(tag)
        if evict and len(held) > 1:
            gone = min(held)
            a.free(held.pop(gone)[0])
            pinned.discard(gone)
    before = a.free_pages
    moved = a.compact({t: h for t, h in held.items() if t not in pinned})
    assert a.free_pages == before and not set(moved) & pinned
    walls = sorted(p for t in pinned for p in held[t][0])
    for tag, (pages, runs) in held.items():
        now = moved.get(tag, pages)
        assert _holds(a, now, tag)
        k = 0
        for r in runs:
            assert now[k : k + r] == list(range(now[k], now[k] + r))
            k += r
    taken = [not a._free[p] for p in range(a.n_pages)]
    for lo, hi in zip([-1, *walls], [*walls, a.n_pages], strict=True):
        span = taken[lo + 1 : hi]
        assert span == sorted(span, reverse=True)  # taken pages first, then free ones
