"""Reading unpacked (MLPerf) or packed pre-training records into NumPy batches, checked.

read_unpacked also checks the MLPerf layout of every record (masks and weights ones then zeros,
predictions inside the sequence, ids in range), so that the packer never packs a broken record;
errors name the file and the record.
"""

from __future__ import annotations

import numba

from bert_packed.features import Shapes, float_features
from bert_packed.records.example import RecordError, read_batches


def read_unpacked(path: str, shapes: Shapes, batch_size: int = 1024):
    """Batches of unpacked records, checked for the MLPerf layout (see read_batches)."""
    hint = (f" (--max_seq_length={shapes.max_seq_length}, "
            f"--max_predictions_per_seq={shapes.max_predictions_per_seq})")
    for first, batch in read_batches(path, shapes.record_lengths(False), float_features(False), batch_size, hint):
        _check_unpacked(path, first, batch, shapes)
        yield first, batch


@numba.njit(cache=True, nogil=True)
def _first_bad_unpacked(input_mask, masked_weights, masked_positions, input_ids, masked_ids):
    """The first record whose mask is not ones then zeros (at least 2 ones), whose weights are not
    ones then zeros, whose predictions point outside the sequence or whose ids are outside
    [0, 2**31); -1 when none."""
    for i in range(input_mask.shape[0]):
        length = 0
        while length < input_mask.shape[1] and input_mask[i, length] == 1:
            length += 1
        count = 0
        while count < masked_weights.shape[1] and masked_weights[i, count] == 1:
            count += 1
        bad = length < 2
        for j in range(length, input_mask.shape[1]):
            bad |= input_mask[i, j] != 0
        for m in range(count, masked_weights.shape[1]):
            bad |= masked_weights[i, m] != 0
        for m in range(count):
            bad |= masked_positions[i, m] < 0 or masked_positions[i, m] >= length
        for j in range(input_ids.shape[1]):
            bad |= input_ids[i, j] < 0 or input_ids[i, j] >= 2**31
        for m in range(masked_ids.shape[1]):
            bad |= masked_ids[i, m] < 0 or masked_ids[i, m] >= 2**31
        if bad:
            return i
    return -1


def _check_unpacked(path: str, first: int, batch: dict, shapes: Shapes) -> None:
    row = _first_bad_unpacked(batch["input_mask"], batch["masked_lm_weights"], batch["masked_lm_positions"],
                              batch["input_ids"], batch["masked_lm_ids"])
    if row >= 0:
        raise RecordError(
            f"{path}: record {first + row}: expected input_mask to be at least 2 ones then zeros, "
            f"masked_lm_weights ones then zeros, masked_lm_positions inside the sequence and token ids "
            f"in [0, 2**31)")


def read_packed(path: str, shapes: Shapes, batch_size: int = 1024):
    """Batches of packed records (see read_batches)."""
    hint = (f" (--max_seq_length={shapes.max_seq_length}, --max_sequences_per_pack="
            f"{shapes.max_sequences_per_pack}, --max_predictions_per_seq={shapes.max_predictions_per_seq})")
    yield from read_batches(path, shapes.record_lengths(True), float_features(True), batch_size, hint)
