"""The GPUs that could start a LOAD now, in the order the scheduler offers them models,
without walking every GPU at each look (a cold request's arrival asks for one)."""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from controller.state import GpuState


def placement_key(g: GpuState) -> tuple[float, int, int]:
    """The LOAD placement's order of GPUs: least loaded first (``share``); among equals
    the GPU holding fewest models, so copies spread; then the index."""
    return g.share, len(g.instances), g.index


def least_loaded(gpus: list[GpuState]):
    """``gpus`` in ``placement_key`` order, read lazily (a heap, not a sort: most looks
    place one model on the first)."""
    order = [(*placement_key(g), g) for g in gpus]
    heapify(order)
    while order:
        yield heappop(order)[3]


class IdleGpus:
    """The available GPUs whose PCIe lane is idle, read in ``placement_key`` order.

    A heap of ``placement_key`` entries. An entry is current while its GPU is
    idle and available and holds those figures. The owner reports each change through
    ``changed`` (share, models held, availability) and the lane's hook (idle again); the
    GPUs changed are only noted, and get a current entry when the heap is next read (the
    shares change at every LOAD look, most of them on GPUs no look reads). Stale entries
    are dropped when met, and the heap is rebuilt once it would hold over twice as many
    entries as idle GPUs, and 64 more.

    ``ordered()`` reads it during a look: each GPU at most once, taken off the heap as it
    is read; when the look ends the GPUs read (and any ``changed`` meanwhile) are noted
    as changed. A look changes only the GPUs it has read (a LOAD, its EVICTs), so the
    order is that of sorting them all at its start.
    """

    __slots__ = ("gpus", "idle", "heap", "dirty", "up", "in_service")

    def __init__(self, gpus: list[GpuState]) -> None:
        self.gpus = gpus  # the scheduler's list (GpuState.index is the position in it)
        self.idle: set[int] = set()
        self.heap: list[tuple[float, int, int]] = []
        self.dirty: set[int] = set()  # GPUs changed since the heap was last read
        # GPUs available, idle or not (kept by the scheduler; a model with this many
        # copies can take no more)
        self.up = len(gpus)
        # the GPUs not removed, in index order: what the scheduler's walks over GPUs read
        # (a removed GPU keeps its place in ``gpus`` for good, and is never available
        # again: walking every GPU ever added made each LOAD look cost more with every
        # worker that joined and left)
        self.in_service: list[GpuState] = []
        for g in gpus:
            self.add(g)

    def add(self, g: GpuState) -> None:
        """A new GPU, its PCIe lane idle."""
        self.idle.add(g.index)
        self.dirty.add(g.index)
        self.in_service.append(g)

    def remove(self, g: GpuState) -> None:
        """``g`` removed for good (``Scheduler.remove_gpu``)."""
        self.in_service = [h for h in self.in_service if h is not g]
        self.idle.discard(g.index)

    def hook(self, g: GpuState):
        """The callback for ``g``'s PCIe lane (``lanes.watch``)."""
        idle, dirty, gi, lane = self.idle, self.dirty, g.index, g.pcie

        def on_change() -> None:
            if lane.idle:
                if gi not in idle:
                    idle.add(gi)
                    dirty.add(gi)
            else:
                idle.discard(gi)
        return on_change

    def changed(self, g: GpuState) -> None:
        """``g``'s share, models held or availability may have changed."""
        self.dirty.add(g.index)

    def _flush(self) -> None:
        """A current entry for each GPU changed, idle and available."""
        d = self.dirty
        h, idle, gpus = self.heap, self.idle, self.gpus
        if len(h) + len(d) > 2 * len(idle) + 64:
            h[:] = [placement_key(g) for gi in idle if (g := gpus[gi]).available]
            heapify(h)
        else:
            for gi in d:
                if gi in idle and (g := gpus[gi]).available:
                    heappush(h, placement_key(g))
        d.clear()

    def __bool__(self) -> bool:
        """Whether some GPU is idle and available (drops stale entries off the top)."""
        if self.dirty:
            self._flush()
        h, idle, gpus = self.heap, self.idle, self.gpus
        while h:
            gi = h[0][2]
            if gi in idle and gpus[gi].available:
                return True
            heappop(h)
        return False

    def ordered(self):
        """The idle, available GPUs least loaded first, read lazily (close the generator
        when done with it: that ends the look)."""
        if self.dirty:
            self._flush()
        h, idle, gpus = self.heap, self.idle, self.gpus
        seen = set()
        try:
            while h:
                e = heappop(h)
                gi = e[2]
                if gi in seen or gi not in idle:
                    continue
                g = gpus[gi]
                if not g.available or placement_key(g) != e:
                    continue  # stale: its current entry is elsewhere in the heap
                seen.add(gi)
                yield g
        finally:
            self.dirty.update(seen)
