"""Sequence-length histograms: build, merge and describe (the file format, its checks and its
reader and writer are bert_packed.inputs.histogram_file's).

A histogram is a 1-D integer NumPy array `h` of length L (the maximum sequence length) where
`h[i]` is the number of sequences of length `i + 1`. Every packing algorithm works on this
array alone, so its cost does not grow with the number of sequences.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from bert_packed.inputs.histogram_file import HistogramError


def histogram_from_lengths(lengths: Iterable[int], max_sequence_length: int) -> np.ndarray:
    """Counts sequence lengths.

    >>> histogram_from_lengths([1, 3, 3, 4], max_sequence_length=4).tolist()
    [1, 0, 2, 1]

    Args:
      lengths: lengths of the sequences, each in [1, max_sequence_length].
      max_sequence_length: L.

    Returns:
      int64 array of shape [L].
    """
    lengths = np.asarray(list(lengths) if not isinstance(lengths, np.ndarray) else lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > max_sequence_length):
        bad = lengths[(lengths < 1) | (lengths > max_sequence_length)][0]
        raise HistogramError(f"sequence length {bad} is outside [1, {max_sequence_length}]")
    return np.bincount(lengths, minlength=max_sequence_length + 1)[1:].astype(np.int64)


def merge_histograms(*histograms) -> np.ndarray:
    """Adds histograms of the same maximum length (one per data shard, say).

    >>> merge_histograms([1, 0, 2], [0, 4, 1]).tolist()
    [1, 4, 3]
    """
    if not histograms:
        raise HistogramError("no histograms to merge")
    arrays = [np.asarray(h, dtype=np.int64) for h in histograms]
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise HistogramError(f"cannot merge histograms of different maximum lengths {sorted(lengths)}")
    return np.sum(arrays, axis=0)


@dataclasses.dataclass(frozen=True)
class HistogramStats:
    """What a histogram says about padding and packing.

    Attributes:
      max_sequence_length: L.
      num_sequences: N.
      num_tokens: real (non-padding) tokens.
      padding_fraction: share of the N * L slots that are padding when every sequence has a row.
      max_speedup: N * L / tokens: the speed-up of a perfect packing over padding.
      lower_bound_packs: no packing (at the given depth) needs fewer packs; see lower_bound_packs().
    """

    max_sequence_length: int
    num_sequences: int
    num_tokens: int
    padding_fraction: float
    max_speedup: float
    lower_bound_packs: int


def histogram_stats(histogram, max_sequences_per_pack: int | None = None) -> HistogramStats:
    """Describes a histogram.

    >>> s = histogram_stats([2, 0, 0, 2])   # two sequences of length 1, two of length 4
    >>> s.num_sequences, s.num_tokens, s.padding_fraction, s.lower_bound_packs
    (4, 10, 0.375, 3)
    """
    histogram = np.asarray(histogram, dtype=np.int64)
    length = len(histogram)
    num_sequences = int(histogram.sum())
    num_tokens = int(histogram @ np.arange(1, length + 1))
    slots = num_sequences * length
    return HistogramStats(
        max_sequence_length=length,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
        padding_fraction=1.0 - num_tokens / slots if slots else 0.0,
        max_speedup=slots / num_tokens if num_tokens else 1.0,
        lower_bound_packs=lower_bound_packs(histogram, max_sequences_per_pack),
    )


def lower_bound_packs(histogram, max_sequences_per_pack: int | None = None) -> int:
    """A lower bound on the number of packs any packing needs.

    The largest of three bounds: ceil(tokens / L) (the packs hold every token); the number of
    sequences longer than L / 2 (no two of them share a pack); ceil(N / depth) (no pack holds
    more than depth sequences).

    >>> lower_bound_packs([0, 0, 0, 0, 0, 4])          # four sequences of length 6, L = 6
    4
    >>> lower_bound_packs([9, 0, 0, 0, 0, 0], 2)       # nine of length 1, at most 2 per pack
    5
    """
    histogram = np.asarray(histogram, dtype=np.int64)
    length = len(histogram)
    num_tokens = int(histogram @ np.arange(1, length + 1))
    bound = -(-num_tokens // length)
    bound = max(bound, int(histogram[length // 2:].sum()))  # lengths > L/2 are indices >= L//2
    if max_sequences_per_pack is not None:
        bound = max(bound, -(-int(histogram.sum()) // max_sequences_per_pack))
    return bound


def total_variation(histogram, reference, bin_width: int = 1) -> float:
    """The total-variation distance between two histograms of one L, each normalised: half the
    sum of the absolute differences of their shares, 0 for the same mix of lengths, 1 for
    disjoint ones. With bin_width > 1 the lengths are first grouped in bins of that many.

    >>> total_variation([2, 0, 0, 2], [1, 1, 1, 1]), total_variation([2, 0, 0, 2], [1, 1, 1, 1], bin_width=2)
    (0.5, 0.0)
    """
    if len(histogram) != len(reference):
        raise HistogramError(f"histograms of L={len(histogram)} and L={len(reference)} cannot be compared")
    shares = [np.add.reduceat(np.asarray(h, dtype=np.float64), np.arange(0, len(h), bin_width)) for h in
              (histogram, reference)]
    return 0.5 * float(np.abs(shares[0] / shares[0].sum() - shares[1] / shares[1].sum()).sum())


def sampling_total_variation(reference, num_sequences: int, draws: int = 20, seed: int = 0) -> float:
    """The mean total-variation distance (per length) between `reference` and histograms of
    `num_sequences` lengths drawn from it: what sampling alone puts between a dataset of that size
    and the mix it was drawn from (about 0.14 for 3,000 sequences of Wikipedia-512's mix, 0.08 for
    10,000)."""
    reference = np.asarray(reference, dtype=np.float64)
    rng = np.random.default_rng(seed)
    return float(np.mean([total_variation(rng.multinomial(num_sequences, reference / reference.sum()), reference)
                          for _ in range(draws)]))
