"""The GPUs that could start a LOAD now, in the order the scheduler offers them models,
without walking every GPU at each look (a cold request's arrival asks for one)."""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from controller.state import GpuState


class IdleGpus:
    """The available GPUs whose PCIe lane is idle, read least loaded first: by
    (``share``, number of models held, index), the LOAD placement's order.

    A heap of (share, models held, index) entries. An entry is current while its GPU is
    idle and available and holds those figures; every such GPU has a current entry, as
    the owner reports each change through ``changed`` (share or models held) and the
    lane's hook (idle again). Stale entries are dropped when met, and the heap is rebuilt
    once it holds over twice as many entries as idle GPUs, and 64 more, whoever adds one.

    ``ordered()`` reads it during a look: each GPU at most once, taken off the heap as it
    is read; when the look ends the GPUs read (and any ``changed`` meanwhile) that are
    still idle and available get a current entry again. A look changes only the GPUs it
    has read (a LOAD, its EVICTs), so the order is that of sorting them all at its start.
    """

    __slots__ = ("gpus", "idle", "heap", "look")

    def __init__(self, gpus: list[GpuState]) -> None:
        self.gpus = gpus  # the scheduler's list (GpuState.index is the position in it)
        self.idle: set[int] = set()
        self.heap: list[tuple[float, int, int]] = []
        self.look: set[int] | None = None  # the GPUs read (or changed) in the look under way
        for g in gpus:
            self.add(g)

    def add(self, g: GpuState) -> None:
        """A new GPU, its PCIe lane idle."""
        self.idle.add(g.index)
        self.changed(g)

    def hook(self, g: GpuState):
        """The callback for ``g``'s PCIe lane (``lanes.watch``)."""
        idle, gi, lane = self.idle, g.index, g.pcie

        def on_change() -> None:
            if lane.idle:
                if gi not in idle:
                    idle.add(gi)
                    self.changed(g)
            else:
                idle.discard(gi)
        return on_change

    def changed(self, g: GpuState) -> None:
        """``g``'s share, models held or availability may have changed."""
        gi = g.index
        if gi not in self.idle or not g.available:
            return  # (it gets an entry when idle and available again)
        if self.look is not None:
            self.look.add(gi)
            return
        h = self.heap
        if len(h) > 2 * len(self.idle) + 64:
            self._rebuild()  # (g's current entry is among those made)
        else:
            heappush(h, (g.share, len(g.instances), gi))

    def _rebuild(self) -> None:
        """One current entry per idle, available GPU: the stale ones dropped (shares
        change at every look, most of them on GPUs no look reads)."""
        gpus = self.gpus
        h = self.heap
        h[:] = [(g.share, len(g.instances), gi) for gi in self.idle
                if (g := gpus[gi]).available]
        heapify(h)

    def __bool__(self) -> bool:
        """Whether some GPU is idle and available (drops stale entries off the top)."""
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
        h, idle, gpus = self.heap, self.idle, self.gpus
        if len(h) > 2 * len(idle) + 64:
            self._rebuild()
        self.look = seen = set()
        try:
            while h:
                share, n, gi = heappop(h)
                if gi in seen or gi not in idle:
                    continue
                g = gpus[gi]
                if not g.available or g.share != share or len(g.instances) != n:
                    continue  # stale: its current entry is elsewhere in the heap
                seen.add(gi)
                yield g
        finally:
            self.look = None
            for gi in seen:
                self.changed(gpus[gi])
