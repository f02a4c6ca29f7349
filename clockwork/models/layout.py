"""How a model's weights are laid out in pages: the rule the packager writes by and the
worker's page arena (``worker.memory``) reads by.

Every tensor sits at a 256-byte-aligned offset of one blob of logical pages; a tensor that
fits in a page never straddles a page boundary (it moves to the next page); a tensor
larger than a page starts on a page boundary and spans a *run* of pages that must be
physically contiguous in the arena.
"""

from __future__ import annotations

from collections.abc import Sequence

from clockwork.profiles import PAGE_SIZE

TENSOR_ALIGNMENT = 256  # bytes; every tensor's offset inside the weights blob


def layout_tensors(sizes: Sequence[int], page_size: int = PAGE_SIZE) -> tuple[list[int], int, list[int]]:
    """Place tensors of ``sizes`` bytes by the layout rule above.

    Returns (logical offsets, number of pages, page run lengths).
    """
    offsets: list[int] = []
    runs: list[int] = []
    pos = 0
    counted = 0  # pages in runs so far; always counted * page_size >= pos
    for n in sizes:
        pos = -(-pos // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT
        within = pos % page_size
        if within and (n > page_size or within + n > page_size):
            pos += page_size - within  # no straddling: move to the next page
        if n > page_size:
            span = -(-n // page_size)
            runs.append(span)
            counted += span
        elif pos == counted * page_size:
            runs.append(1)
            counted += 1
        offsets.append(pos)
        pos += n
    if not runs:
        runs = [1]
    return offsets, sum(runs), runs
