"""Synthetic length histograms shaped like BERT pre-training data, for benchmarks and tests."""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.special


def wikipedia_like_histogram(num_sequences: int, max_sequence_length: int = 512,
                             full_fraction: float = 0.23, padding_fraction: float = 0.5,
                             seed: int | None = None) -> np.ndarray:
    """A long-tailed length histogram like MLPerf Wikipedia's.

    `full_fraction` of the sequences are exactly L long (documents cut at L); the rest follow a
    Beta(1.5, b) shape over lengths 1..L-1, with b chosen so that padding the whole set to L
    wastes `padding_fraction` of the slots. The counts are the expected ones, rounded so that
    they sum to `num_sequences` exactly; with a `seed`, the counts are instead a multinomial
    sample, with the count noise of real data.

    The defaults match Wikipedia at L=512 (docs/packing.md: ~50% padding, ~23% exactly 512).

    >>> h = wikipedia_like_histogram(1000, 64)
    >>> int(h.sum()), int(h[-1])
    (1000, 230)

    Args:
      num_sequences: N.
      max_sequence_length: L.
      full_fraction: share of sequences of length exactly L.
      padding_fraction: share of padding slots when every sequence has its own row.
      seed: None for the expected counts; an int to sample the counts.

    Returns:
      int64 array [L].
    """
    lengths = np.arange(1, max_sequence_length)
    target_mean = (1.0 - padding_fraction) * max_sequence_length
    rest_mean = (target_mean - full_fraction * max_sequence_length) / (1.0 - full_fraction)
    if not 1.0 <= rest_mean < max_sequence_length - 1:
        raise ValueError(f"no histogram with full_fraction={full_fraction} and padding_fraction={padding_fraction}")

    def shape(b: float) -> np.ndarray:
        edges = np.arange(max_sequence_length) / (max_sequence_length - 1)
        # Beta(1.5, b)'s distribution function, the regularized incomplete beta function: the
        # same numbers as scipy.stats.beta.cdf, without importing scipy.stats (0.8-0.9 s of
        # every command's start-up here).
        probabilities = np.diff(scipy.special.betainc(1.5, b, edges))
        return probabilities / probabilities.sum()

    b = scipy.optimize.brentq(lambda b: shape(b) @ lengths - rest_mean, 0.05, 200.0)
    probabilities = np.append(shape(b) * (1.0 - full_fraction), full_fraction)
    if seed is not None:
        return np.random.default_rng(seed).multinomial(num_sequences, probabilities).astype(np.int64)
    expected = probabilities * num_sequences
    counts = np.floor(expected).astype(np.int64)
    # Largest remainders get the sequences that flooring dropped.
    shortfall = num_sequences - int(counts.sum())
    counts[np.argsort(counts - expected)[:shortfall]] += 1
    return counts
