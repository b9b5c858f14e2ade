"""Reading unpacked or packed TFRecords into NumPy batches, with errors that name the record.

Raw records come from tfrecord.read_record_batches (both checksums checked, so a corrupt or
truncated file is reported by file and record index). A batch is parsed by a compiled
tf.train.Example parser that only knows the expected features (_parse_examples: with framing
and checksums as fast as TensorFlow's parser alone, and no TensorFlow import; see
scripts/benchmark_pack_pretraining_data.py); a batch it does not take (a missing feature, a
wrong length, a bytes list, an unusual encoding) goes to TensorFlow's parser, which either parses
it or leads to an error naming the record.
"""

from __future__ import annotations

from typing import Iterator

import numba
import numpy as np

from bert_packed.data.schema import UNPACKED_FLOAT_FEATURES, Shapes
from bert_packed.data.tfrecord import read_record_batches


class RecordError(ValueError):
    """A record does not have the features or lengths the flags expect."""


def _feature_spec(lengths: dict[str, int], float_features=()):
    import tensorflow as tf

    return {name: tf.io.FixedLenFeature([length], tf.float32 if name in float_features else tf.int64)
            for name, length in lengths.items()}


@numba.njit(cache=True, nogil=True)
def _varint(data, at, end):
    """(value, index after it) of the varint at data[at]; index -1 when it runs past `end`."""
    value, shift = np.uint64(0), np.uint64(0)
    while at < end and shift < 64:
        byte = np.uint64(data[at])
        value |= (byte & np.uint64(0x7F)) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += np.uint64(7)
    return value, -1


@numba.njit(cache=True, nogil=True)
def _field(data, at, end):
    """(field number, wire type, start, stop) of the protobuf field at data[at]: its value is
    data[start:stop] (the content of a length-delimited one), and the next field begins at stop;
    stop is -1 when the field is malformed or runs past `end`."""
    tag, at = _varint(data, at, end)
    field, wire = np.int64(tag >> np.uint64(3)), np.int64(tag & np.uint64(7))
    if at < 0:
        return field, wire, at, -1
    if wire == 0:
        return field, wire, at, _varint(data, at, end)[1]
    if wire == 2:
        size, at = _varint(data, at, end)
        stop = at + np.int64(size)
    elif wire == 1 or wire == 5:
        stop = at + (8 if wire == 1 else 4)
    else:
        return field, wire, at, -1
    return field, wire, at, stop if 0 <= at and stop <= end else -1


@numba.njit(cache=True, nogil=True)
def _parse_list(data, at, end, want_float, out, row, first, count):
    """Parses an Int64List or FloatList into out[row, first:first + count], values packed or one
    a field; returns the values found (-1 when malformed). Floats are stored as their bits."""
    found = 0
    while at < end:
        field, wire, start, at = _field(data, at, end)
        if at < 0:
            return -1
        if field != 1:
            continue
        if want_float and (wire == 2 or wire == 5):
            if (at - start) % 4:
                return -1
            for value_at in range(start, at, 4):
                if found < count:
                    out[row, first + found] = (np.int64(data[value_at]) | np.int64(data[value_at + 1]) << 8
                                               | np.int64(data[value_at + 2]) << 16 | np.int64(data[value_at + 3]) << 24)
                found += 1
        elif not want_float and (wire == 2 or wire == 0):
            while start < at:
                if data[start] < 0x80:  # one byte: most values; then two
                    value, start = np.uint64(data[start]), start + 1
                elif start + 1 < at and data[start + 1] < 0x80:
                    value = np.uint64(data[start] & 0x7F) | np.uint64(data[start + 1]) << np.uint64(7)
                    start += 2
                else:
                    value, start = _varint(data, start, at)
                    if start < 0:
                        return -1
                if found < count:
                    out[row, first + found] = np.int64(value)
                found += 1
        else:
            return -1
    return found


@numba.njit(cache=True, nogil=True)
def _feature_index(data, start, stop, names, name_starts):
    """Which expected feature the key data[start:stop] names (-1: none)."""
    for f in range(len(name_starts) - 1):
        if name_starts[f + 1] - name_starts[f] == stop - start:
            same = True
            for k in range(stop - start):
                if data[start + k] != names[name_starts[f] + k]:
                    same = False
                    break
            if same:
                return f
    return -1


@numba.njit(cache=True, nogil=True)
def _parse_examples(data, starts, lengths, names, name_starts, is_float, columns, out):
    """Parses tf.train.Example records into out [n, columns[-1]]: feature f in the columns
    columns[f]:columns[f + 1]. Returns the first record that does not hold exactly the expected
    features with exactly their lengths (-1 when all do)."""
    num_features = len(columns) - 1
    found = np.zeros(num_features, np.int64)
    for row in range(len(starts)):
        found[:] = -1
        at, end = starts[row], starts[row] + lengths[row]
        while at < end:  # Example: features = 1
            field, wire, entry, at = _field(data, at, end)
            if at < 0:
                return row
            if field != 1 or wire != 2:
                continue
            features_end = at
            while entry < features_end:  # Features: feature = 1, map entries
                field, wire, start, entry = _field(data, entry, features_end)
                if entry < 0:
                    return row
                if field != 1 or wire != 2:
                    continue
                key_start, key_stop, value_start, value_stop = -1, -1, -1, -1
                while start < entry:  # the entry: key = 1, value = 2
                    field, wire, content, start = _field(data, start, entry)
                    if start < 0:
                        return row
                    if field == 1 and wire == 2:
                        key_start, key_stop = content, start
                    elif field == 2 and wire == 2:
                        value_start, value_stop = content, start
                feature = _feature_index(data, key_start, key_stop, names, name_starts) if key_start >= 0 else -1
                if feature < 0:
                    continue  # a feature nobody asked for
                if found[feature] >= 0 or value_start < 0:
                    return row  # repeated key (protobuf would keep the last) or no value
                found[feature] = 0
                count = columns[feature + 1] - columns[feature]
                list_field = 2 if is_float[feature] else 3
                while value_start < value_stop:  # Feature: bytes_list = 1 | float_list = 2 | int64_list = 3
                    field, wire, content, value_start = _field(data, value_start, value_stop)
                    if value_start < 0 or (field != list_field and 1 <= field <= 3):
                        return row  # malformed, or a list of another type
                    if field == list_field and wire == 2:
                        got = _parse_list(data, content, value_start, is_float[feature], out, row,
                                          columns[feature] + found[feature], count - found[feature])
                        if got < 0:
                            return row
                        found[feature] += got
                if found[feature] != count:
                    return row
        for f in range(num_features):
            if found[f] < 0:
                return row
    return -1


def read_batches(path: str, lengths: dict[str, int], float_features=(), batch_size: int = 1024,
                 flag_hint: str = "") -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Yields (index of the batch's first record, {feature: array [batch, length]}) for one file.

    Integer features come as int64, float features as float32.

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
    encoded = [name.encode() for name in lengths]
    names = np.frombuffer(b"".join(encoded), np.uint8)
    name_starts = np.cumsum([0] + [len(name) for name in encoded])
    is_float = np.array([name in float_features for name in lengths])
    columns = np.cumsum([0] + list(lengths.values()))
    for first, data, starts, sizes in read_record_batches(path, batch_size):
        out = np.empty((len(starts), columns[-1]), np.int64)
        bad = _parse_examples(np.frombuffer(data, np.uint8), starts, sizes, names, name_starts, is_float, columns, out)
        if bad >= 0:
            records = [data[a:a + n] for a, n in zip(starts.tolist(), sizes.tolist())]
            yield first, _parse(path, first, records, _feature_spec(lengths, float_features), lengths, flag_hint)
            continue
        batch = {}
        for f, name in enumerate(lengths):
            values = out[:, columns[f]:columns[f + 1]]
            batch[name] = values.astype(np.uint32).view(np.float32) if is_float[f] else values
        yield first, batch


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
    yield from read_batches(path, shapes.packed_lengths(), (), batch_size, hint)
