"""Host-side layout rules every engine shares.

The engines address a tensor ``(..., H, W)`` plane by plane: plane ``p`` (the leading
dimensions flattened in C order) starts ``(p // n1) * s0 + (p % n1) * s1`` elements after the
first.  Leading dimensions that collapse to at most two such strides are read in place
(slices, permutations, stride-0 expanded dimensions); others need one contiguous copy.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple


def extent(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a view's first to one past its last (strides are never negative in torch):
    the storage span the view reaches; 0 when it is empty.

    >>> extent((3, 4), (8, 2))
    23
    >>> extent((0, 4), (4, 1))
    0
    """
    if 0 in sizes:
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(sizes, strides))


def collapse_planes(sizes: Sequence[int], strides: Sequence[int]) -> Optional[Tuple[int, int, int]]:
    """Leading ``sizes``/``strides`` -> ``(n1, s0, s1)`` with plane ``p`` at
    ``(p // n1) * s0 + (p % n1) * s1``, or ``None`` when they do not collapse to two strides.

    >>> collapse_planes((4, 3), (3 * 64, 64))      # contiguous: one dimension of 12 planes
    (12, 0, 64)
    >>> collapse_planes((4, 3), (64, 4 * 64))      # transposed: two strides
    (3, 64, 256)
    >>> collapse_planes((2, 2, 2), (1000, 10, 1)) is None
    True
    """
    dims = []
    for s, st in zip(sizes, strides):
        if s == 1:
            continue
        if dims and dims[-1][1] == st * s:
            dims[-1] = (dims[-1][0] * s, st)
        else:
            dims.append((s, st))
    if not dims:
        return 1, 0, 0
    if len(dims) == 1:
        return dims[0][0], 0, dims[0][1]
    if len(dims) == 2:
        return dims[1][0], dims[0][1], dims[1][1]
    return None
