"""Histogram packing by optimisation over exact-fill strategies: NNLSHP and an LP solver.

An exact-fill strategy is a multiset of at most `depth` lengths that sums to exactly L. Both
solvers choose how many packs of each strategy to make, then fill the strategies' slots with
the real sequences and pack whatever is left over greedily.

- NNLSHP (Krell et al., "Efficient sequence packing without cross-contamination"): a weighted
  non-negative least-squares fit of strategy counts to the histogram, rounded to integers.
- LP (this project): the linear program "fewest packs that hold every sequence", where a slot of
  length l may hold any sequence no longer than l (the unused part is padding). It is solved with
  HiGHS on a sparse matrix, so it is both faster and tighter than NNLSHP at the same depth: its
  optimum is also a lower bound for any packing at that depth.

See docs/packing.md.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging

import numpy as np
import scipy.optimize
import scipy.sparse

from bert_packed.errors import SettingsError
from bert_packed.packing.greedy import Strategies, lpfhp

# Dense NNLS needs an L x S float matrix; this caps it at ~400 MB.
MAX_NNLS_MATRIX_ENTRIES = 50_000_000
# The LP's columns: HiGHS held 1.2-1.5 GB for the 959,631 of L=512 at depth 4 (docs/packing.md).
MAX_LP_STRATEGIES = 1_000_000
# HiGHS's interior point (with its crossover to a vertex) is 2-5x faster than its dual simplex at
# L=512, depth 3 (22,102 strategies); at depth 4 (959,631) its crossover failed after 50 s, where
# the dual simplex solved in 29 s.
SIMPLEX_FIRST_STRATEGIES = 200_000


def count_exact_fill_strategies(max_sequence_length: int, depth: int, limit: int | None = None) -> int:
    """Number of multisets of at most `depth` lengths summing to L (partitions of L).

    With `limit`, counting stops at the first depth with more than `limit`: then the result is
    only known to exceed `limit` (time and memory stay bounded at any L and depth).

    >>> count_exact_fill_strategies(512, 3)
    22102
    """
    return _strategies_by_depth(max_sequence_length, depth, limit)[-1]


def _strategies_by_depth(max_sequence_length: int, depth: int, limit: int | None = None) -> list[int]:
    """The number of exact-fill strategies at each depth 0..min(`depth`, L), or up to the first
    depth with more than `limit`."""
    # ways[n]: partitions of n into at most k parts. From k - 1 to k, ways[n] += ways[n - k] for
    # n ascending: a running sum over each residue of n modulo k. One row, O(L) memory.
    ways = [1] + [0] * max_sequence_length
    counts = [ways[-1]]
    for k in range(1, min(depth, max_sequence_length) + 1):  # deeper adds none: L has at most L parts
        for residue in range(k):
            ways[residue::k] = itertools.accumulate(ways[residue::k])
        counts.append(ways[-1])
        if limit is not None and ways[-1] > limit:
            break
    return counts


def exact_fill_strategies(max_sequence_length: int, depth: int) -> list[tuple[int, ...]]:
    """All multisets of at most `depth` lengths that sum to exactly L, longest first.

    >>> exact_fill_strategies(4, 3)
    [(4,), (3, 1), (2, 2), (2, 1, 1)]
    """
    result: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...], remaining: int, largest: int) -> None:
        if remaining == 0:
            result.append(prefix)
            return
        slots_left = depth - len(prefix)
        if slots_left == 0:
            return
        # The next length is at most `largest` and large enough for the rest to fit the slots.
        smallest = -(-remaining // slots_left)
        for length in range(min(largest, remaining), smallest - 1, -1):
            extend(prefix + (length,), remaining - length, length)

    extend((), max_sequence_length, max_sequence_length)
    return result


def strategy_matrix(strategies: list[tuple[int, ...]], max_sequence_length: int) -> scipy.sparse.csc_matrix:
    """The L x S matrix A with A[l - 1, s] = how often length l occurs in strategy s."""
    rows = np.fromiter((length - 1 for s in strategies for length in s), dtype=np.int64)
    cols = np.repeat(np.arange(len(strategies)), [len(s) for s in strategies])
    data = np.ones(len(rows))
    return scipy.sparse.csc_matrix((data, (rows, cols)), shape=(max_sequence_length, len(strategies)))


@functools.lru_cache(maxsize=8)
def exact_fill_columns(max_sequence_length: int, depth: int) -> tuple[tuple[tuple[int, ...], ...], scipy.sparse.csc_matrix]:
    """exact_fill_strategies and their strategy_matrix, made once a process for each (L, depth):
    they do not depend on the histogram, and making them took 1 s of a 5 s plan at L=128, depth 6
    (587,535 strategies), again for every file or run planned. Read-only: shared by every caller.

    >>> exact_fill_columns(4, 3)[1].toarray().astype(int).tolist()
    [[0, 1, 0, 2], [0, 0, 2, 1], [0, 1, 0, 0], [1, 0, 0, 0]]
    """
    strategies = tuple(exact_fill_strategies(max_sequence_length, depth))
    return strategies, strategy_matrix(strategies, max_sequence_length)


def nnlshp(histogram, max_sequences_per_pack: int = 3) -> Strategies:
    """Non-negative least-squares histogram packing.

    Fits strategy counts x >= 0 to min ||W (A x - h)|| with scipy.optimize.nnls, where the
    shortest lengths (<= 8) get weight 0.09 so that over-using them, which costs only a little
    padding, is cheap. x is rounded; over-covered lengths become padding, and sequences left
    uncovered are packed at most two per pack (best fit).

    Worked example (L = 8): three 6s and three 2s fit exactly as three (6, 2) packs.

    >>> nnlshp([0, 3, 0, 0, 0, 3, 0, 0], max_sequences_per_pack=3)
    [((6, 2), 3)]

    Args:
      histogram: int array [L]; histogram[i] = number of sequences of length i + 1.
      max_sequences_per_pack: depth of the enumerated strategies.

    Returns:
      Strategies, sorted by their lengths.
    """
    histogram = np.asarray(histogram, dtype=np.int64)
    max_length = len(histogram)
    limit = MAX_NNLS_MATRIX_ENTRIES // max_length
    if count_exact_fill_strategies(max_length, max_sequences_per_pack, limit) > limit:
        raise SettingsError(
            f"nnlshp at L={max_length} and depth {max_sequences_per_pack} needs a dense "
            f"{max_length} x (over {limit:,}) matrix; use a smaller --max-sequences-per-pack, "
            f"or the lp or lpfhp algorithm")
    strategies, matrix = exact_fill_columns(max_length, max_sequences_per_pack)
    matrix = matrix.toarray()
    weights = np.ones(max_length)
    weights[:8] = 0.09
    counts, _ = scipy.optimize.nnls(matrix * weights[:, None], histogram * weights, maxiter=10 * len(strategies))
    packs, leftover = fill_slots(strategies, np.rint(counts).astype(np.int64), histogram, allow_shorter=False)
    for lengths, count in lpfhp(leftover, min(2, max_sequences_per_pack)) if leftover.any() else []:
        packs[lengths] += count
    return sorted(packs.items())


def lp_packing(histogram, max_sequences_per_pack: int = 3) -> Strategies:
    """Linear-programming histogram packing: fewest packs, exact-fill strategies, HiGHS.

    Variables: x_s >= 0 packs of each exact-fill strategy s, and f_l >= 0 slots of length l
    handed down to hold sequences of length l - 1 (so any slot may hold a shorter sequence).
    Minimise sum(x) subject to (A x)_l - f_l + f_{l+1} >= h_l for every length l, over the
    strategies the histogram's lengths need (strategies_for). The solution is rounded both to
    the nearest integers and down; each rounding's slots are filled with real
    sequences, longest first (slots of over-covered lengths become padding), whatever is left
    over is packed with LPFHP, and the plan of fewer packs is kept.

    Worked example (L = 8, depth 3): four 1s, two 3s and two 5s: 20 tokens in 8 sequences.

    >>> lp_packing([4, 0, 2, 0, 2, 0, 0, 0], max_sequences_per_pack=3)
    [((3, 3, 1), 1), ((5, 1), 1), ((5, 1, 1), 1)]

    Three packs: the optimum, since 8 sequences at most 3 per pack need ceil(8 / 3) = 3. The LP
    optimum (1.6 x (6, 1, 1), 0.8 x (4, 3, 1), 0.4 x (5, 3): 2.8 packs) rounds to two (6, 1, 1)
    packs and one (4, 3, 1). The 5s take the 6-slots, the 3s the 4- and 3-slot, the 1s four of
    the five 1-slots; the fifth stays empty.

    It never fails in the solver: a depth with more than MAX_LP_STRATEGIES strategies is solved
    at the deepest depth that has fewer (its packs are valid at the depth asked for) and the plan
    with fewer packs of that and LPFHP's at the full depth is kept; an LP HiGHS cannot solve is
    packed by LPFHP. Each says so in one line (logging).

    Args:
      histogram: int array [L]; histogram[i] = number of sequences of length i + 1.
      max_sequences_per_pack: depth of the enumerated strategies.

    Returns:
      Strategies, sorted by their lengths.
    """
    histogram = np.asarray(histogram, dtype=np.int64)
    max_length = len(histogram)
    counts_by_depth = _strategies_by_depth(max_length, max_sequences_per_pack, MAX_LP_STRATEGIES)
    shallower = counts_by_depth[-1] > MAX_LP_STRATEGIES
    depth = len(counts_by_depth) - (2 if shallower else 1)
    if shallower:
        logging.warning("lp at L=%d and depth %d would have over %s strategies (%s at depth %d): solved at depth "
                        "%d instead, the better of that plan and lpfhp's at depth %d kept", max_length,
                        max_sequences_per_pack, f"{MAX_LP_STRATEGIES:,}", f"{counts_by_depth[-1]:,}", depth + 1,
                        depth, max_sequences_per_pack)
    try:
        counts, strategies = solve_packing_lp(histogram, depth)
    except (PackingLPError, MemoryError) as e:
        logging.warning("%s; packed with lpfhp at depth %d instead", str(e) or "out of memory in the packing LP",
                        max_sequences_per_pack)
        return sorted(lpfhp(histogram, max_sequences_per_pack))
    packs = min((rounded_plan(strategies, rounding(counts), histogram, depth) for rounding in (np.rint, np.floor)),
                key=lambda packs: sum(packs.values()))
    if shallower:
        greedy = lpfhp(histogram, max_sequences_per_pack)
        if sum(count for _, count in greedy) < sum(packs.values()):
            return sorted(greedy)
    return sorted(packs.items())


def strategies_for(histogram, columns: scipy.sparse.csc_matrix) -> np.ndarray:
    """The strategies (columns) the packing LP of `histogram` needs: those whose slots, but for
    the longest, are lengths the histogram holds.

    The LP's optimum stays what it is over every strategy: a slot of a length no sequence has
    only ever holds shorter ones, so any strategy is matched or beaten by the kept one made of
    its slots cut down to the nearest length that occurs, its slack added to its longest slot.
    How many are kept depends on which lengths occur: at L=128, depth 6, random sets of 12-48
    lengths kept 91-3,807 of the 587,535 strategies and were planned in 0.1-0.15 s, 64 lengths
    13,350-27,274 in 0.3-0.6 s, and every length keeps all of them (5-9 s).

    >>> strategies, columns = exact_fill_columns(6, 3)   # (6,) (5, 1) (4, 2) (4, 1, 1) (3, 3) (3, 2, 1) (2, 2, 2)
    >>> [strategies[s] for s in strategies_for([3, 0, 1, 0, 0, 0], columns)]   # three 1s, a 3
    [(6,), (5, 1), (4, 1, 1), (3, 3)]

    Args:
      histogram: int array [L].
      columns: the strategies' L x S matrix (exact_fill_columns).

    Returns:
      The kept strategies' indices, ascending.
    """
    lengths, starts = columns.indices, columns.indptr[:-1]
    longest = np.repeat(np.maximum.reduceat(lengths, starts), np.diff(columns.indptr))
    fits = (np.asarray(histogram)[lengths] > 0) | ((lengths == longest) & (columns.data == 1))
    return np.flatnonzero(np.minimum.reduceat(fits, starts))


def rounded_plan(strategies, counts, histogram, depth: int) -> collections.Counter:
    """The packs of `counts` (rounded) of each strategy, their slots filled with the sequences,
    and what is left packed by LPFHP."""
    packs, leftover = fill_slots(strategies, counts.astype(np.int64), histogram, allow_shorter=True)
    for lengths, count in lpfhp(leftover, depth) if leftover.any() else []:
        packs[lengths] += count
    return packs


class PackingLPError(RuntimeError):
    """HiGHS did not solve the packing LP (lp_packing then packs with LPFHP)."""


def solve_packing_lp(histogram, max_sequences_per_pack: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Solves the LP relaxation of lp_packing; returns (fractional counts, strategies).

    sum(counts) is a lower bound on the packs of any packing at this depth. Solved by HiGHS: its
    interior point method (with crossover) up to SIMPLEX_FIRST_STRATEGIES strategies, its dual
    simplex above; when one method fails, the other.

    Raises:
      SettingsError: more than MAX_LP_STRATEGIES strategies.
      PackingLPError: neither method solved it.
    """
    histogram = np.asarray(histogram, dtype=np.int64)
    max_length = len(histogram)
    if count_exact_fill_strategies(max_length, max_sequences_per_pack, MAX_LP_STRATEGIES) > MAX_LP_STRATEGIES:
        raise SettingsError(
            f"lp at L={max_length} and depth {max_sequences_per_pack} has over {MAX_LP_STRATEGIES:,} "
            f"strategies; use a smaller --max-sequences-per-pack or the lpfhp algorithm")
    strategies, columns = exact_fill_columns(max_length, max_sequences_per_pack)
    kept = strategies_for(histogram, columns)
    if len(kept) < len(strategies):
        strategies, columns = [strategies[s] for s in kept], columns[:, kept]
    # Hand-down flow f_l for l = 2..L: leaves row l (-1), arrives at row l - 1 (+1).
    lengths = np.arange(2, max_length + 1)
    flow = scipy.sparse.csc_matrix(
        (np.concatenate([-np.ones(max_length - 1), np.ones(max_length - 1)]),
         (np.concatenate([lengths - 1, lengths - 2]), np.tile(np.arange(max_length - 1), 2))),
        shape=(max_length, max_length - 1))
    constraints = scipy.sparse.hstack([columns, flow]).tocsc()
    cost = np.concatenate([np.ones(len(strategies)), np.zeros(max_length - 1)])
    methods = ["highs-ipm", "highs-ds"]
    if len(strategies) > SIMPLEX_FIRST_STRATEGIES:
        methods.reverse()
    result = scipy.optimize.linprog(cost, A_ub=-constraints, b_ub=-histogram.astype(float), bounds=(0, None),
                                    method=methods[0])
    if result.status != 0:
        logging.warning("the packing LP at depth %d: HiGHS's %s stopped (%s); solving it with %s",
                        max_sequences_per_pack, methods[0], result.message, methods[1])
        result = scipy.optimize.linprog(cost, A_ub=-constraints, b_ub=-histogram.astype(float), bounds=(0, None),
                                        method=methods[1])
    if result.status != 0:
        raise PackingLPError(f"the packing LP at depth {max_sequences_per_pack} did not solve ({result.message})")
    return result.x[:len(strategies)], strategies


def fill_slots(strategies, counts, histogram, allow_shorter: bool):
    """Puts real sequences into `counts[s]` packs of each strategy's slots.

    Lengths are taken longest first. A sequence of length l goes into a slot of length l; with
    `allow_shorter`, it may instead take the shortest free slot longer than l. Slots left empty
    become padding.

    >>> packs, leftover = fill_slots([(4,), (3, 1)], [2, 1], [1, 0, 2, 1], allow_shorter=True)
    >>> sorted(packs.items()), leftover.tolist()
    ([((3,), 1), ((3, 1), 1), ((4,), 1)], [0, 0, 0, 0])

    Args:
      strategies: list of tuples of slot lengths.
      counts: int array [S], packs of each strategy.
      histogram: int array [L], the sequences to place.
      allow_shorter: whether a slot may hold a shorter sequence.

    Returns:
      (Counter mapping a tuple of sequence lengths to its number of packs,
       int array [L] of the sequences that found no slot).
    """
    max_length = len(histogram)
    remaining = np.array(histogram, dtype=np.int64)
    # The strategies used: at most L (one per row of a vertex of the LP), of up to a million columns.
    used = [(int(s), int(counts[s])) for s in np.flatnonzero(np.asarray(counts) > 0)]
    slots_by_length: list[list[list[int]]] = [[] for _ in range(max_length + 1)]
    for s, count in used:
        for position, length in enumerate(strategies[s]):
            slots_by_length[length].append([s, position, count])

    # Free slot groups [strategy, position, count], the shortest on top.
    free: list[list[int]] = []
    filled = collections.defaultdict(list)  # (strategy, position) -> [(sequence length, count)]
    for length in range(max_length, 0, -1):
        free.extend(slots_by_length[length])
        need = int(remaining[length - 1])
        while need and free:
            s, position, count = free[-1]
            placed = min(count, need)
            filled[(s, position)].append((length, placed))
            need -= placed
            if placed == count:
                free.pop()
            else:
                free[-1][2] -= placed
        remaining[length - 1] = need
        if not allow_shorter:
            free.clear()

    packs: collections.Counter = collections.Counter()
    for s, count in used:
        runs = []
        for position in range(len(strategies[s])):
            run = filled.get((s, position), [])
            empty = count - sum(c for _, c in run)
            runs.append(run + ([(0, empty)] if empty else []))
        for lengths, repeat in _zip_runs(runs):
            if lengths:
                packs[lengths] += repeat
    return packs, remaining


def _zip_runs(runs):
    """Walks run-length encoded columns of equal total in step.

    >>> list(_zip_runs([[(5, 2), (4, 1)], [(1, 1), (0, 2)]]))
    [((5, 1), 1), ((5,), 1), ((4,), 1)]
    """
    cursors = [[list(segment) for segment in run] for run in runs]
    while cursors[0]:
        repeat = min(column[0][1] for column in cursors)
        lengths = tuple(sorted((column[0][0] for column in cursors if column[0][0]), reverse=True))
        yield lengths, repeat
        for column in cursors:
            column[0][1] -= repeat
            if column[0][1] == 0:
                column.pop(0)
