"""The histogram file, what a command reads of its data's lengths: the format, its checks, its
reader and writer.

A histogram is a 1-D integer NumPy array `h` of length L (the maximum sequence length) where
`h[i]` is the number of sequences of length `i + 1`. On disk (docs/data_formats.md):
`{"max_sequence_length": L, "histogram": [c_1, ..., c_L]}`; a bare JSON list of counts is
accepted too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from bert_packed.errors import UserError, raise_if_retryable
from bert_packed.inputs.dataset_info import MAX_SEQ_LENGTH_LIMIT
from bert_packed.storage import files
from bert_packed.storage.files import write_text_atomically


class HistogramError(UserError, ValueError):
    """A histogram (or the file holding it) is not what a histogram must be."""


def check_histogram(counts, max_sequence_length: int | None = None, source: str = "histogram"):
    """Validates counts and returns them as an int64 array of length L.

    Args:
      counts: sequence of counts, `counts[i]` = number of sequences of length `i + 1`.
      max_sequence_length: L. A shorter histogram is padded with zeros; a longer one is an error.
        None means L = len(counts).
      source: what to call the histogram in error messages (a file name, say).

    Returns:
      int64 array of shape [L].

    Raises:
      HistogramError: naming the first bad entry.
    """
    if isinstance(counts, (str, bytes, dict)) or not isinstance(counts, (Sequence, np.ndarray)):
        raise HistogramError(f"{source}: expected a list of counts, got {type(counts).__name__}")
    if max_sequence_length is not None:
        if isinstance(max_sequence_length, bool) or not isinstance(max_sequence_length, (int, np.integer)):
            raise HistogramError(f"{source}: max_sequence_length must be an integer, got {max_sequence_length!r}")
        if max_sequence_length < 1:
            raise HistogramError(f"{source}: max_sequence_length must be >= 1, got {max_sequence_length}")
    length = len(counts) if max_sequence_length is None else int(max_sequence_length)
    if length > MAX_SEQ_LENGTH_LIMIT:
        raise HistogramError(f"{source}: max_sequence_length {length:,} is beyond any BERT; this planner takes up to "
                             f"{MAX_SEQ_LENGTH_LIMIT:,} (BERT uses 512; the longest variants 4,096 to 8,192)")
    if len(counts) > length:
        raise HistogramError(
            f"{source}: has counts for lengths up to {len(counts)}, longer than the maximum "
            f"sequence length {length}")
    result = np.zeros(length, dtype=np.int64)
    for i, count in enumerate(counts):
        if isinstance(count, bool) or not isinstance(count, (int, float, np.integer, np.floating)):
            raise HistogramError(f"{source}: count for length {i + 1} is {count!r}; expected a non-negative integer")
        if not math.isfinite(count) or count != int(count):
            raise HistogramError(f"{source}: count for length {i + 1} is {count!r}; expected a whole number")
        if count < 0:
            raise HistogramError(f"{source}: count for length {i + 1} is {count!r}; counts must be non-negative")
        if count >= 2**62:
            raise HistogramError(f"{source}: count for length {i + 1} is {count!r}; counts must be below 2**62")
        result[i] = int(count)
    if length == 0 or not result.any():
        raise HistogramError(f"{source}: the histogram is empty (no sequences)")
    tokens = sum(int(count) * (i + 1) for i, count in enumerate(result.tolist()) if count)
    if tokens >= 2**62:
        raise HistogramError(f"{source}: {tokens:,} tokens in all; the counts must add up to below 2**62 tokens")
    return result


# The largest histogram file read: L = 65,536 counts of up to 19 digits each take ~1.5 MB.
MAX_HISTOGRAM_BYTES = 16 << 20


def load_histogram(path: str, max_sequence_length: int | None = None) -> np.ndarray:
    """Reads a histogram JSON file (object with `histogram`, or a bare list of counts).

    Args:
      path: the file.
      max_sequence_length: overrides the file's L (a bare list has none: its length is L).

    Returns:
      int64 array of shape [L].

    Raises:
      HistogramError: the file is unreadable, not JSON, or holds a bad histogram.
    """
    try:
        # Read whole: a device (/dev/zero) never ends, a pipe blocks, and an L of 65,536 takes ~1.5 MB.
        if files.exists(path) and not files.isfile(path):
            raise HistogramError(f"{path}: not a regular file (a directory, a device or a pipe); expected a "
                                 f"histogram JSON file")
        if files.exists(path) and files.size(path) > MAX_HISTOGRAM_BYTES:
            raise HistogramError(f"{path}: {files.size(path):,} bytes; a histogram JSON file holds at most "
                                 f"{MAX_HISTOGRAM_BYTES:,}")
        with files.open_file(path) as f:
            payload = json.load(f)
    except OSError as e:
        raise_if_retryable(e)
        raise HistogramError(f"{path}: cannot read the histogram file: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HistogramError(f"{path}: not valid JSON: {e}") from None
    if isinstance(payload, dict):
        if "histogram" not in payload:
            raise HistogramError(f"{path}: expected a JSON object with a 'histogram' list of counts")
        if max_sequence_length is None:
            max_sequence_length = payload.get("max_sequence_length")
        payload = payload["histogram"]
    return check_histogram(payload, max_sequence_length, source=path)


def save_histogram(path: str, histogram) -> None:
    """Writes a histogram JSON file atomically (a temporary name, then a rename)."""
    histogram = np.asarray(histogram, dtype=np.int64)
    payload = {"max_sequence_length": int(len(histogram)), "histogram": histogram.tolist()}
    write_text_atomically(path, json.dumps(payload) + "\n")
