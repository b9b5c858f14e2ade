"""Reading unpacked or packed TFRecords into NumPy batches, with errors that name the record.

Raw records come from tfrecord.read_records (both checksums checked, so a corrupt or truncated
file is reported by file and record index); batches are parsed by TensorFlow's C++ parser. A
record whose features do not have the expected lengths is found and named.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from bert_packed.data.schema import UNPACKED_FLOAT_FEATURES, Shapes
from bert_packed.data.tfrecord import read_records


class RecordError(ValueError):
    """A record does not have the features or lengths the flags expect."""


def _feature_spec(lengths: dict[str, int], float_features=()):
    import tensorflow as tf

    return {name: tf.io.FixedLenFeature([length], tf.float32 if name in float_features else tf.int64)
            for name, length in lengths.items()}


def read_batches(path: str, lengths: dict[str, int], float_features=(), batch_size: int = 1024,
                 flag_hint: str = "") -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Yields (index of the batch's first record, {feature: array [batch, length]}) for one file.

    Args:
      path: a TFRecord file of tf.train.Example records.
      lengths: feature name -> expected length.
      float_features: names parsed as float32 (the others as int64).
      batch_size: records per batch.
      flag_hint: added to length errors (which flag sets the expected length).

    Raises:
      CorruptRecordError: the file is truncated or corrupt (file and record named).
      RecordError: a record lacks a feature or has the wrong length (file, record, feature named).
    """
    spec = _feature_spec(lengths, float_features)
    batch: list[bytes] = []
    first = 0
    for index, record in enumerate(read_records(path)):
        batch.append(record)
        if len(batch) == batch_size:
            yield first, _parse(path, first, batch, spec, lengths, flag_hint)
            first, batch = index + 1, []
    if batch:
        yield first, _parse(path, first, batch, spec, lengths, flag_hint)


def _parse(path, first, batch, spec, lengths, flag_hint):
    import tensorflow as tf

    try:
        parsed = tf.io.parse_example(tf.constant(batch), spec)
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError):
        _raise_for_bad_record(path, first, batch, lengths, flag_hint)
        raise
    return {name: value.numpy() for name, value in parsed.items()}


def _raise_for_bad_record(path, first, batch, lengths, flag_hint):
    import tensorflow as tf

    for offset, record in enumerate(batch):
        where = f"{path}: record {first + offset}"
        try:
            example = tf.train.Example.FromString(record)
        except Exception:  # noqa: BLE001 - any decode failure means the same thing here
            raise RecordError(f"{where}: not a tf.train.Example") from None
        for name, length in lengths.items():
            if name not in example.features.feature:
                raise RecordError(f"{where}: has no feature {name!r} (expected {sorted(lengths)})")
            feature = example.features.feature[name]
            found = len(feature.int64_list.value) or len(feature.float_list.value)
            if found != length:
                raise RecordError(f"{where}: feature {name!r} has {found} values, expected {length}"
                                  f"{flag_hint}")


def read_unpacked(path: str, shapes: Shapes, batch_size: int = 1024):
    """Batches of unpacked records, checked for the MLPerf layout (see read_batches)."""
    hint = (f" (--max_seq_length={shapes.max_seq_length}, "
            f"--max_predictions_per_seq={shapes.max_predictions_per_seq})")
    for first, batch in read_batches(path, shapes.unpacked_lengths(), UNPACKED_FLOAT_FEATURES, batch_size, hint):
        _check_unpacked(path, first, batch, shapes)
        yield first, batch


def _check_unpacked(path: str, first: int, batch: dict, shapes: Shapes) -> None:
    """Masks must be prefixes of ones; predictions must point inside the sequence."""
    mask = batch["input_mask"]
    lengths = mask.sum(axis=1)
    columns = np.arange(mask.shape[1])
    bad = (mask != (columns < lengths[:, None])).any(axis=1) | (lengths < 2)
    weights = batch["masked_lm_weights"]
    num_predictions = (weights > 0).sum(axis=1)
    pred_columns = np.arange(weights.shape[1])
    bad |= (weights != (pred_columns < num_predictions[:, None])).any(axis=1)
    positions = batch["masked_lm_positions"]
    bad |= ((positions >= lengths[:, None]) & (pred_columns < num_predictions[:, None])).any(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise RecordError(
            f"{path}: record {first + row}: expected input_mask to be {lengths[row]} ones then zeros, "
            f"masked_lm_weights ones then zeros, and masked_lm_positions inside the sequence")


def read_packed(path: str, shapes: Shapes, batch_size: int = 1024):
    """Batches of packed records (see read_batches)."""
    hint = (f" (--max_seq_length={shapes.max_seq_length}, --max_sequences_per_pack="
            f"{shapes.max_sequences_per_pack}, --max_predictions_per_seq={shapes.max_predictions_per_seq})")
    yield from read_batches(path, shapes.packed_lengths(), (), batch_size, hint)
