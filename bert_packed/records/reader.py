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


# What _first_bad_unpacked finds wrong, by the code it returns.
_PROBLEMS = ("input_mask is not at least 2 ones then zeros", "masked_lm_weights is not ones then zeros",
             "masked_lm_positions points outside the sequence", "input_ids is outside [0, 2**31)",
             "masked_lm_ids is outside [0, 2**31)", "segment_ids is not 0 or 1", "next_sentence_labels is not 0 or 1")


@numba.njit(cache=True, nogil=True)
def _first_bad_unpacked(input_mask, masked_weights, masked_positions, input_ids, masked_ids, segment_ids, labels):
    """(the first record that breaks the MLPerf layout, the code of its problem in _PROBLEMS);
    (-1, -1) when none. Every value is checked against the range the packer's compact rows hold."""
    for i in range(input_mask.shape[0]):
        length = 0
        while length < input_mask.shape[1] and input_mask[i, length] == 1:
            length += 1
        count = 0
        while count < masked_weights.shape[1] and masked_weights[i, count] == 1:
            count += 1
        if length < 2:
            return i, 0
        for j in range(length, input_mask.shape[1]):
            if input_mask[i, j] != 0:
                return i, 0
        for m in range(count, masked_weights.shape[1]):
            if masked_weights[i, m] != 0:
                return i, 1
        for m in range(count):
            if masked_positions[i, m] < 0 or masked_positions[i, m] >= length:
                return i, 2
        for j in range(input_ids.shape[1]):
            if input_ids[i, j] < 0 or input_ids[i, j] >= 2**31:
                return i, 3
        for m in range(masked_ids.shape[1]):
            if masked_ids[i, m] < 0 or masked_ids[i, m] >= 2**31:
                return i, 4
        for j in range(segment_ids.shape[1]):
            if segment_ids[i, j] != 0 and segment_ids[i, j] != 1:
                return i, 5
        if labels[i, 0] != 0 and labels[i, 0] != 1:
            return i, 6
    return -1, -1


def _check_unpacked(path: str, first: int, batch: dict, shapes: Shapes) -> None:
    row, problem = _first_bad_unpacked(batch["input_mask"], batch["masked_lm_weights"], batch["masked_lm_positions"],
                                       batch["input_ids"], batch["masked_lm_ids"], batch["segment_ids"],
                                       batch["next_sentence_labels"])
    if row >= 0:
        raise RecordError(
            f"{path}: record {first + row}: expected input_mask to be at least 2 ones then zeros, "
            f"masked_lm_weights ones then zeros, masked_lm_positions inside the sequence, token ids "
            f"in [0, 2**31), segment_ids and next_sentence_labels 0 or 1 (here {_PROBLEMS[problem]})")


def read_packed(path: str, shapes: Shapes, batch_size: int = 1024):
    """Batches of packed records (see read_batches)."""
    hint = (f" (--max_seq_length={shapes.max_seq_length}, --max_sequences_per_pack="
            f"{shapes.max_sequences_per_pack}, --max_predictions_per_seq={shapes.max_predictions_per_seq})")
    yield from read_batches(path, shapes.record_lengths(True), float_features(True), batch_size, hint)
