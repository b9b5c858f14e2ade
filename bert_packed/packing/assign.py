"""Packs for sequences held in memory: which pack each sequence goes to, and where in it.

A fine-tuning set (tens of thousands of short examples) fits in memory: its lengths are planned
on their own histogram, as pack_pretraining_data plans a corpus, and each sequence is placed by
its length and its rank among the sequences of that length, through the same slot table.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_packed.packing.histogram import histogram_from_lengths
from bert_packed.packing.packer import SlotTable, keyed_permutation
from bert_packed.packing.plan import DEFAULT_ALGORITHM, PackingPlan, plan


@dataclasses.dataclass(frozen=True)
class PackAssignment:
    """Where each sequence goes.

    Attributes:
      pack: int64 [n], the pack of each sequence, 0..num_packs - 1.
      position: int64 [n], its place in the pack, 0 first (its sequence index is position + 1).
      plan: the packing plan it follows.
    """

    pack: np.ndarray
    position: np.ndarray
    plan: PackingPlan

    @property
    def num_packs(self) -> int:
        return self.plan.num_packs

    def members(self) -> list[list[int]]:
        """The sequences of each pack, in their order in it."""
        order = np.lexsort((self.position, self.pack))
        bounds = np.searchsorted(self.pack[order], np.arange(self.num_packs + 1))
        return [order[bounds[g]:bounds[g + 1]].tolist() for g in range(self.num_packs)]


def assign_to_packs(lengths, max_sequence_length: int, max_sequences_per_pack: int,
                    algorithm: str = DEFAULT_ALGORITHM, seed: int = 0) -> PackAssignment:
    """Plans packs for sequences of `lengths` and places every one of them exactly once.

    Which sequences of one length share a pack is a keyed permutation of their ranks (`seed`):
    packs do not follow the input's order (a file sorted by label would otherwise make packs of
    one label).

    >>> lengths = [6, 2, 6, 2, 6, 2]
    >>> a = assign_to_packs(lengths, 8, 3, "spfhp")   # three packs of a 6 and a 2
    >>> a.num_packs, [[lengths[i] for i in pack] for pack in a.members()]
    (3, [[6, 2], [6, 2], [6, 2]])

    Args:
      lengths: int [n], each in [1, max_sequence_length].
      max_sequence_length: L, the tokens of a pack.
      max_sequences_per_pack: S, at most this many sequences a pack (1: one a pack, unpacked).
      algorithm: the planner's algorithm (packing.ALGORITHMS).
      seed: which sequences of one length share packs.

    Returns:
      A PackAssignment.

    Raises:
      HistogramError: a length outside [1, L], or no lengths.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    histogram = histogram_from_lengths(lengths, max_sequence_length)
    packing_plan = plan(histogram, max_sequence_length, algorithm, max_sequences_per_pack)
    return place(lengths, packing_plan, max_sequence_length, seed)


def place(lengths, packing_plan: PackingPlan, max_sequence_length: int, seed: int = 0) -> PackAssignment:
    """Places sequences of `lengths` in the packs of `packing_plan` (a plan of their histogram):
    assign_to_packs without the planning, so that a set can be placed anew with another `seed`
    (an epoch of fine-tuning packed on the fly) on one plan.

    >>> lengths = [6, 2, 6, 2, 6, 2]
    >>> one = assign_to_packs(lengths, 8, 3, "spfhp")
    >>> again = place(lengths, one.plan, 8, seed=7)
    >>> again.num_packs, sorted(map(sorted, again.members())) != sorted(map(sorted, one.members()))
    (3, True)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    histogram = histogram_from_lengths(lengths, max_sequence_length)
    # Rank of each sequence among those of its length, in input order.
    order = np.argsort(lengths, kind="stable")
    sorted_lengths = lengths[order]
    rank = np.empty(len(lengths), dtype=np.int64)
    rank[order] = np.arange(len(lengths)) - np.searchsorted(sorted_lengths, sorted_lengths)
    slot = keyed_permutation(rank, histogram[lengths - 1], key=seed * 1_000_003 + lengths)
    pack, position = SlotTable(packing_plan.strategies, max_sequence_length).locate(lengths, slot)
    return PackAssignment(pack, position, packing_plan)
