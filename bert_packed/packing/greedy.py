"""Greedy histogram packing: SPFHP (worst fit) and LPFHP (best fit decreasing).

Both walk the lengths from longest to shortest and place each length's whole count at once
into groups of identical open packs, so the work depends on L, not on the number of sequences.
An open group is (count, lengths) with some free space; a group is split when fewer sequences
than packs remain. When no open pack fits, new packs take as many copies of the length as fit
(what placing the sequences one at a time would do). Packs close when full or when they hold
`max_sequences_per_pack` sequences.

A strategy list is a list of (lengths, count) pairs: `count` packs each holding sequences of the
given lengths (longest first). docs/packing.md compares them with the original algorithms.
"""

from __future__ import annotations

import bisect
import collections

import numpy as np

Strategies = list[tuple[tuple[int, ...], int]]


def spfhp(histogram, max_sequences_per_pack: int) -> Strategies:
    """Shortest-pack-first histogram packing: each length goes to the emptiest pack it fits.

    When nothing fits, new packs are opened holding as many copies of the length as fit (the
    original opens one pack per sequence, which strands the shortest sequences in nearly empty
    packs).

    Worked example (L = 8): four 6s, two 5s, six 2s and two 1s, at most 3 per pack.

    >>> spfhp([2, 6, 0, 0, 2, 4, 0, 0], max_sequences_per_pack=3)
    [((5, 2, 1), 2), ((6, 2), 4)]

    The 6s open four packs with 2 free slots, the 5s two packs with 3 free. The 2s go worst-fit:
    first into the 5-packs (most space), then into the 6-packs, which are then full; the 1s
    fill the 5-packs. Six packs, 42 of 48 slots used.

    Args:
      histogram: int array [L]; histogram[i] = number of sequences of length i + 1.
      max_sequences_per_pack: depth; at most this many sequences share a pack.

    Returns:
      Strategies, sorted by their lengths.
    """
    return _greedy_walk(histogram, max_sequences_per_pack, best_fit=False)


def lpfhp(histogram, max_sequences_per_pack: int) -> Strategies:
    """Longest-pack-first histogram packing: best fit decreasing on the histogram.

    Each length goes to the fullest open pack it still fits.

    Worked example (the same data as spfhp's):

    >>> lpfhp([2, 6, 0, 0, 2, 4, 0, 0], max_sequences_per_pack=3)
    [((5, 2, 1), 2), ((6, 2), 4)]

    The 6s and 5s each open packs of one. Best fit puts the 2s into the 6-packs first (2 free,
    the least space that fits), then into the 5-packs; the 1s close the 5-packs.

    >>> lpfhp([0, 0, 6, 0, 0, 0, 0, 0], max_sequences_per_pack=3)   # six 3s: two per pack
    [((3, 3), 3)]

    Args:
      histogram: int array [L]; histogram[i] = number of sequences of length i + 1.
      max_sequences_per_pack: depth; at most this many sequences share a pack.

    Returns:
      Strategies, sorted by their lengths.
    """
    return _greedy_walk(histogram, max_sequences_per_pack, best_fit=True)


def _greedy_walk(histogram, depth: int, best_fit: bool) -> Strategies:
    histogram = np.asarray(histogram, dtype=np.int64)
    max_length = len(histogram)
    open_groups: list[list[tuple[int, tuple[int, ...]]]] = [[] for _ in range(max_length + 1)]
    spaces: list[int] = []  # sorted free-space values that have open groups
    closed: collections.Counter = collections.Counter()

    def add(count: int, lengths: tuple[int, ...], space: int) -> None:
        if space == 0 or len(lengths) >= depth:
            closed[lengths] += count
            return
        if not open_groups[space]:
            bisect.insort(spaces, space)
        open_groups[space].append((count, lengths))

    def take(space: int) -> tuple[int, tuple[int, ...]]:
        group = open_groups[space].pop()
        if not open_groups[space]:
            del spaces[bisect.bisect_left(spaces, space)]
        return group

    for length in range(max_length, 0, -1):
        remaining = int(histogram[length - 1])
        while remaining > 0:
            if best_fit:
                i = bisect.bisect_left(spaces, length)
                space = spaces[i] if i < len(spaces) else None
            else:
                space = spaces[-1] if spaces and spaces[-1] >= length else None
            if space is None:
                per_pack = min(depth, max_length // length)
                full_packs, rest = divmod(remaining, per_pack)
                if full_packs:
                    add(full_packs, (length,) * per_pack, max_length - per_pack * length)
                if rest:
                    add(1, (length,) * rest, max_length - rest * length)
                break
            count, lengths = take(space)
            placed = min(count, remaining)
            if count > placed:
                add(count - placed, lengths, space)
            add(placed, lengths + (length,), space - length)
            remaining -= placed

    for space in spaces:
        for count, lengths in open_groups[space]:
            closed[lengths] += count
    return sorted(closed.items())
