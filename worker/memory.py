"""The weights cache: one preallocated, page-aligned buffer cut into fixed-size pages.

Layout rule (:mod:`clockwork.models.layout`, shared with the packager)
---------------------------------------------------------------------
A model's weights are one blob of ``weights_pages`` *logical* pages. The packager
places every tensor at a 256-byte-aligned offset and never lets a tensor that fits in
a page straddle a page boundary (it moves to the next page instead). A tensor larger
than a page starts on a page boundary and spans several logical pages; those pages
form a *run* that must be physically contiguous in the arena. The package lists the
run lengths (``page_runs``; all 1 unless some tensor is larger than a page).

So LOAD = allocate free pages (contiguous only within a run) + copy the blob page by
page; EVICT = free the pages. When the free pages are enough but scattered, so that no
run fits, the device first slides the loaded weights no EXEC is reading together
(:meth:`PageArena.compact`) and binds them where they now lie. Nothing is allocated while serving: a tensor is a
zero-copy view of arena memory, found by ``(logical offset, shape, dtype)`` and the
model's page list. Views are 256-byte aligned (TVM's ``from_dlpack`` wants 64).

Backends: ``numpy`` (host memory, the CPU device). The CUDA device will use a cupy
buffer; only :func:`_allocate` and :meth:`PageArena._as_array` know the backend.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from clockwork.models.layout import TENSOR_ALIGNMENT, layout_tensors
from clockwork.profiles import PAGE_SIZE

ARENA_ALIGNMENT = 4096  # bytes; the arena's base address is a multiple of this


class ArenaError(RuntimeError):
    """Not enough free pages, a bad page list, or a tensor outside its pages."""


def _allocate(nbytes: int, backend: str) -> np.ndarray:
    """A uint8 buffer of ``nbytes`` whose address is ARENA_ALIGNMENT-aligned."""
    if backend != "numpy":
        # seam for the CUDA device: cupy.empty(...) over-allocated and sliced the same way
        raise ArenaError(f"arena backend {backend!r} is not supported here (only 'numpy')")
    raw = np.empty(nbytes + ARENA_ALIGNMENT, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ARENA_ALIGNMENT
    buf = raw[skip : skip + nbytes]
    buf.fill(0)  # touch every page now: a first LOAD must not pay the page faults
    return buf


class PageArena:
    """``n_pages`` pages of ``page_size`` bytes in one aligned buffer.

    ``alloc`` hands out page indices (lowest first, so tests are deterministic);
    ``free`` returns them. The arena does not know which model owns which pages: the
    caller (the device) keeps that page table.
    """

    def __init__(self, n_pages: int, page_size: int = PAGE_SIZE, backend: str = "numpy") -> None:
        if n_pages <= 0:
            raise ValueError("n_pages must be positive")
        if page_size <= 0 or page_size % TENSOR_ALIGNMENT:
            raise ValueError(f"page_size must be a positive multiple of {TENSOR_ALIGNMENT}")
        self.n_pages = n_pages
        self.page_size = page_size
        self.backend = backend
        self.buffer = self._allocate(n_pages * page_size)
        self._free = [True] * n_pages
        self._n_free = n_pages

    def _allocate(self, nbytes: int):
        """The memory behind the pages (subclasses: device memory, or none at all)."""
        return _allocate(nbytes, self.backend)

    # -- accounting ----------------------------------------------------------------

    @property
    def free_pages(self) -> int:
        return self._n_free

    @property
    def used_pages(self) -> int:
        return self.n_pages - self._n_free

    @property
    def address(self) -> int:
        return int(self.buffer.ctypes.data)

    def alloc(self, n: int, runs: Sequence[int] | None = None) -> list[int]:
        """Take ``n`` free pages. ``runs`` (lengths summing to ``n``) asks for each run
        to be physically contiguous; without it any free pages do."""
        if runs is None:
            runs = [1] * n
        if sum(runs) != n or any(r <= 0 for r in runs):
            raise ArenaError(f"runs {list(runs)} do not split {n} pages")
        if n > self._n_free:
            raise ArenaError(f"needs {n} pages, {self._n_free} free")
        taken: list[int] = []
        try:
            for r in runs:
                start = self._find_run(r)
                for p in range(start, start + r):
                    self._free[p] = False
                taken.extend(range(start, start + r))
        except ArenaError:
            for p in taken:
                self._free[p] = True
            raise
        self._n_free -= n
        return taken

    def _find_run(self, length: int) -> int:
        count = 0
        for i, free in enumerate(self._free):
            count = count + 1 if free else 0
            if count == length:
                return i - length + 1
        raise ArenaError(f"no {length} contiguous free pages (fragmented; {self._n_free} free)")

    def compact(self, holders: Mapping[Hashable, tuple[Sequence[int], Sequence[int]]],
                moved: dict[Hashable, list[int]] | None = None,
                broken: set[Hashable] | None = None) -> dict[Hashable, list[int]]:
        """Slide the pages of ``holders`` (key -> (pages, runs), each run's pages
        contiguous, as :meth:`alloc` gave them) towards page 0, in address order, so the
        free pages come together; their contents move with them. Taken pages that no
        holder lists (weights an EXEC or a LOAD is using) stay where they are, and
        nothing slides past them. Returns the new page list of every holder that moved
        (logical page k of a holder stays its k-th page), in ``moved`` if given: it is
        filled run by run, so that if a copy fails (raises) it holds every holder whose
        pages the page table already shows elsewhere; and ``broken`` (if given) then
        holds the holder whose run was being copied onto its own pages when it failed
        (its contents partly overwritten: it cannot serve from either place)."""
        free = self._free
        first: dict[int, tuple[Hashable, int, int]] = {}  # a run's first page -> (key, k, length)
        claimed: set[int] = set()
        for key, (pages, runs) in holders.items():
            k = 0
            for r in runs:
                run = list(pages[k : k + r])
                if (len(run) != r or run != list(range(run[0], run[0] + r))
                        or any(free[q] or q in claimed for q in run)):
                    raise ArenaError(f"{key!r}: pages {list(pages)} are not its own taken "
                                     f"runs {list(runs)}")
                claimed.update(run)
                first[run[0]] = (key, k, r)
                k += r
        if moved is None:
            moved = {}
        low = 0  # the pages below are settled; those from low up to p are free
        p = 0
        while p < self.n_pages:
            if free[p]:
                p += 1
                continue
            run = first.get(p)
            if run is None:  # nobody to move: it stays, and nothing goes past it
                low = p = p + 1
                continue
            key, k, r = run
            if low < p:  # down to low: [low, low + r) is free or this run's own
                try:
                    for i in range(r):  # upwards: a page is read before it is overwritten
                        self._move(p + i, low + i)
                except BaseException:
                    if low + r > p and broken is not None:
                        broken.add(key)
                    raise
                for i in range(r):
                    free[p + i] = True
                for i in range(r):
                    free[low + i] = False
                moved.setdefault(key, list(holders[key][0]))[k : k + r] = range(low, low + r)
            low += r
            p += r
        return moved

    def _move(self, src: int, dst: int) -> None:
        """Page ``src``'s bytes onto page ``dst`` (two different pages)."""
        ps = self.page_size
        self.buffer[dst * ps : (dst + 1) * ps] = self.buffer[src * ps : (src + 1) * ps]

    def free(self, pages: Sequence[int]) -> None:
        for p in pages:
            if not 0 <= p < self.n_pages:
                raise ArenaError(f"page {p} is outside the arena (0..{self.n_pages - 1})")
            if self._free[p]:
                raise ArenaError(f"page {p} is already free")
        for p in pages:
            self._free[p] = True
        self._n_free += len(pages)

    # -- data ----------------------------------------------------------------------

    def page(self, index: int) -> np.ndarray:
        """Page ``index`` as a uint8 view."""
        if not 0 <= index < self.n_pages:
            raise ArenaError(f"page {index} is outside the arena (0..{self.n_pages - 1})")
        start = index * self.page_size
        return self.buffer[start : start + self.page_size]

    def write(self, pages: Sequence[int], data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Copy a weights blob laid out page by page: logical page k -> ``pages[k]``."""
        blob = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        blob = blob.reshape(-1).view(np.uint8)
        if blob.size > len(pages) * self.page_size:
            raise ArenaError(f"{blob.size} bytes do not fit in {len(pages)} pages")
        ps = self.page_size
        for k, p in enumerate(pages):
            chunk = blob[k * ps : (k + 1) * ps]
            if chunk.size == 0:
                break
            self._copy(self.page(p)[: chunk.size], chunk)

    @staticmethod
    def _copy(dst, chunk: np.ndarray) -> None:
        """Host bytes into arena memory (a device arena overrides this)."""
        dst[...] = chunk

    def view(self, pages: Sequence[int], offset: int, shape: Sequence[int],
             dtype: str | np.dtype) -> np.ndarray:
        """Zero-copy view of a tensor at logical ``offset`` of a blob held in ``pages``."""
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        ps = self.page_size
        first, within = divmod(offset, ps)
        span = max(1, -(-(within + nbytes) // ps))
        if first + span > len(pages):
            raise ArenaError(f"tensor at offset {offset} ({nbytes} bytes) runs past "
                             f"{len(pages)} pages")
        start = pages[first]
        if span > 1 and list(pages[first : first + span]) != list(range(start, start + span)):
            raise ArenaError(f"tensor at offset {offset} spans pages "
                             f"{list(pages[first:first + span])}, which are not contiguous")
        base = start * ps + within
        return self.buffer[base : base + nbytes].view(dt).reshape(tuple(shape))


__all__ = ["ARENA_ALIGNMENT", "TENSOR_ALIGNMENT", "ArenaError", "PageArena", "layout_tensors"]
