"""plan(): run a packing algorithm on a histogram, check the result, report the figures."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from bert_packed.errors import InternalError, SettingsError
from bert_packed.inputs.histogram_file import check_histogram
from bert_packed.packing.exact_fill import lp_packing, nnlshp
from bert_packed.packing.greedy import lpfhp, spfhp
from bert_packed.packing.histogram import lower_bound_packs

# name -> function(histogram, max_sequences_per_pack) -> [(lengths, count)]
ALGORITHMS = {
    "spfhp": spfhp,
    "lpfhp": lpfhp,
    "nnlshp": nnlshp,
    "lp": lp_packing,
}
# The algorithm when none is named: plan(), PackSettings and pack_pretraining_data's --algorithm.
DEFAULT_ALGORITHM = "lp"


class PlanError(InternalError):
    """An algorithm produced an invalid plan (a bug: please report it with the histogram)."""


@dataclasses.dataclass(frozen=True)
class PackingPlan:
    """How to pack a dataset: which sequence lengths share a pack, and how many such packs.

    Attributes:
      algorithm: the algorithm that made the plan.
      max_sequence_length: L, the slots of a pack.
      max_sequences_per_pack: the depth limit (None: unlimited).
      strategies: ((lengths, count), ...): `count` packs each holding sequences of `lengths`.
      lower_bound_packs: no packing at this depth needs fewer packs (histogram.lower_bound_packs).
      seconds: how long the algorithm ran.
    """

    algorithm: str
    max_sequence_length: int
    max_sequences_per_pack: int | None
    strategies: tuple[tuple[tuple[int, ...], int], ...]
    lower_bound_packs: int
    seconds: float

    @property
    def num_packs(self) -> int:
        return sum(count for _, count in self.strategies)

    @property
    def num_sequences(self) -> int:
        return sum(len(lengths) * count for lengths, count in self.strategies)

    @property
    def num_tokens(self) -> int:
        return sum(sum(lengths) * count for lengths, count in self.strategies)

    @property
    def efficiency(self) -> float:
        """Real tokens / slots of all packs."""
        return self.num_tokens / (self.num_packs * self.max_sequence_length)

    @property
    def packing_factor(self) -> float:
        """Sequences per pack."""
        return self.num_sequences / self.num_packs

    def to_dict(self) -> dict:
        """The plan's figures and strategies as plain JSON-able values."""
        return {
            "algorithm": self.algorithm,
            "max_sequence_length": self.max_sequence_length,
            "max_sequences_per_pack": self.max_sequences_per_pack,
            "num_packs": self.num_packs,
            "num_sequences": self.num_sequences,
            "num_tokens": self.num_tokens,
            "efficiency": self.efficiency,
            "packing_factor": self.packing_factor,
            "lower_bound_packs": self.lower_bound_packs,
            "seconds": self.seconds,
            "strategies": [[list(lengths), count] for lengths, count in self.strategies],
        }


def plan(histogram, max_sequence_length: int | None = None, algorithm: str = DEFAULT_ALGORITHM,
         max_sequences_per_pack: int | None = 3) -> PackingPlan:
    """Plans how to pack the sequences counted by a histogram.

    >>> p = plan([0, 3, 0, 0, 0, 3, 0, 0], 8, "spfhp", 3)   # three 2s, three 6s
    >>> p.strategies, p.num_packs, p.efficiency, p.packing_factor
    ((((6, 2), 3),), 3, 1.0, 2.0)

    Args:
      histogram: counts; histogram[i] = number of sequences of length i + 1.
      max_sequence_length: L (None: len(histogram)). A shorter histogram is padded with zeros.
      algorithm: one of ALGORITHMS (default DEFAULT_ALGORITHM).
      max_sequences_per_pack: depth, at least 1; None for unlimited (greedy algorithms only).

    Returns:
      A PackingPlan that places every sequence exactly once.

    Raises:
      HistogramError: bad counts, or a histogram longer than L or empty.
      ValueError: unknown algorithm or bad depth.
      PlanError: the algorithm broke its contract (a bug).
    """
    histogram = check_histogram(histogram, max_sequence_length)
    if algorithm not in ALGORITHMS:
        raise SettingsError(f"unknown packing algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
    if max_sequences_per_pack is not None and (
            isinstance(max_sequences_per_pack, bool) or not isinstance(max_sequences_per_pack, (int, np.integer))
            or max_sequences_per_pack < 1):
        raise SettingsError(f"max_sequences_per_pack must be an integer >= 1 (or None), got {max_sequences_per_pack!r}")
    max_length = len(histogram)
    depth = max_length if max_sequences_per_pack is None else min(int(max_sequences_per_pack), max_length)

    start = time.perf_counter()
    strategies = ALGORITHMS[algorithm](histogram, depth)
    seconds = time.perf_counter() - start

    check_strategies(strategies, histogram, depth, algorithm)
    return PackingPlan(
        algorithm=algorithm,
        max_sequence_length=max_length,
        max_sequences_per_pack=max_sequences_per_pack,
        strategies=tuple((tuple(int(x) for x in lengths), int(count)) for lengths, count in strategies),
        lower_bound_packs=lower_bound_packs(histogram, depth),
        seconds=seconds,
    )


def check_strategies(strategies, histogram, depth: int, algorithm: str = "plan") -> None:
    """Raises PlanError unless the strategies place every sequence exactly once within L and depth."""
    max_length = len(histogram)
    used = np.zeros(max_length, dtype=np.int64)
    for lengths, count in strategies:
        if count < 1 or not lengths or len(lengths) > depth or sum(lengths) > max_length \
                or min(lengths) < 1:
            raise PlanError(f"{algorithm}: invalid strategy {lengths} x {count} "
                            f"(L={max_length}, depth={depth})")
        for length in lengths:
            used[length - 1] += count
    if not np.array_equal(used, histogram):
        wrong = np.flatnonzero(used != histogram)[0]
        raise PlanError(f"{algorithm}: plan places {used[wrong]} sequences of length {wrong + 1}, "
                        f"the histogram has {histogram[wrong]}")
