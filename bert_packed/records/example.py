"""The tf.train.Example codec for the features of bert_packed.features, without TensorFlow.

Encoding: building a tf.train.Example through the protobuf API costs ~180 us for one BERT record
at L=512; the compiled encoder here serializes and frames a packed record in ~30 us
(scripts/benchmark_pack_pretraining_data.py). Layout, as written here: Example{features=1:
Features{feature=1 (one map entry per feature){key=1: name, value=2: Feature{float_list=2 |
int64_list=3: {value=1, packed}}}}}.

Parsing: raw records come from tfrecord.read_record_batches (both checksums checked, so a
corrupt or truncated file is reported by file and record index). A batch is parsed by a
compiled parser that only knows the expected features (_parse_examples: with framing and
checksums as fast as TensorFlow's parser alone, and no TensorFlow import); a batch it does not
take (a missing feature, a wrong length, a bytes list, an unusual encoding) goes to TensorFlow's
parser, which either parses it or leads to an error naming the record.
"""

from __future__ import annotations

from collections.abc import Iterator

import numba
import numpy as np

from bert_packed.console.tensorflow_loading import import_tensorflow
from bert_packed.errors import UserError
from bert_packed.features import tf_feature_spec
from bert_packed.records.tfrecord import _put_frame, _put_uint, read_record_batches


class RecordError(UserError, ValueError):
    """A record does not have the features or lengths the flags expect."""


@numba.njit(cache=True, nogil=True)
def _varint_size(value) -> int:
    """Bytes of the protobuf varint of an int (negative ints take 10, as two's complement)."""
    value = np.uint64(value)
    size = 1
    for k in range(1, 10):  # compares, no data-dependent branch
        size += value >= np.uint64(1) << np.uint64(7 * k)
    return size


@numba.njit(cache=True, nogil=True)
def _put_varint(out, at, value) -> int:
    """Writes the varint of `value` at out[at]; returns the index after it."""
    value = np.uint64(value)
    while value >= 0x80:
        out[at] = (value & np.uint64(0x7F)) | np.uint64(0x80)
        value >>= np.uint64(7)
        at += 1
    out[at] = value
    return at + 1


@numba.njit(cache=True, nogil=True)
def _put_small_varint(out, at, value) -> int:
    """_put_varint without unpredictable branches for values below 2**21 (three bytes are
    written, as many as needed are kept): it may write two bytes past the value."""
    value = np.uint64(value)
    if value >= np.uint64(1 << 21):
        return _put_varint(out, at, value)
    two, three = value >= np.uint64(1 << 7), value >= np.uint64(1 << 14)
    out[at] = (value & np.uint64(0x7F)) | (np.uint64(two) << np.uint64(7))
    out[at + 1] = ((value >> np.uint64(7)) & np.uint64(0x7F)) | (np.uint64(three) << np.uint64(7))
    out[at + 2] = value >> np.uint64(14)
    return at + 1 + two + three


@numba.njit(cache=True, nogil=True)
def _entry_size(key_size, payload_size):
    """Bytes inside one feature's map entry: its key and its Feature."""
    list_size = 1 + _varint_size(payload_size) + payload_size
    value_size = 1 + _varint_size(list_size) + list_size
    return 1 + _varint_size(key_size) + key_size + 1 + _varint_size(value_size) + value_size


@numba.njit(cache=True, nogil=True)
def _encode(features, is_float, keys, key_starts, scratch, out, ends):
    """Serializes and frames record i of `features` (a tuple of [N, n_f] arrays) for every i.

    A length precedes what it measures, so a record's payloads are first written to `scratch`;
    their sizes give every length, and the record is then written front to back. Returns the
    bytes used; record i ends at ends[i].
    """
    num_features = len(features)
    payload_ends = np.empty(num_features, np.int64)
    at = 0
    for i in range(features[0].shape[0]):
        end = 0
        for f in range(num_features):
            if is_float[f]:
                for value in features[f][i]:
                    _put_uint(scratch, end, value, 4)
                    end += 4
            else:
                for value in features[f][i]:
                    end = _put_small_varint(scratch, end, value)
            payload_ends[f] = end
        body_size = 0
        for f in range(num_features):
            payload_size = payload_ends[f] - (payload_ends[f - 1] if f else 0)
            entry_size = _entry_size(key_starts[f + 1] - key_starts[f], payload_size)
            body_size += 1 + _varint_size(entry_size) + entry_size
        record = at
        out[at + 12] = 0x0A  # Example.features
        at = _put_varint(out, at + 13, body_size)
        for f in range(num_features):
            key = keys[key_starts[f]:key_starts[f + 1]]
            payload_start = payload_ends[f - 1] if f else 0
            payload_size = payload_ends[f] - payload_start
            list_size = 1 + _varint_size(payload_size) + payload_size
            value_size = 1 + _varint_size(list_size) + list_size
            out[at] = 0x0A  # Features.feature: a map entry {key=1, value=2: Feature}
            at = _put_varint(out, at + 1, _entry_size(len(key), payload_size))
            out[at] = 0x0A  # key
            at = _put_varint(out, at + 1, len(key))
            out[at:at + len(key)] = key
            at += len(key)
            out[at] = 0x12  # value
            at = _put_varint(out, at + 1, value_size)
            out[at] = 0x12 if is_float[f] else 0x1A  # float_list or int64_list
            at = _put_varint(out, at + 1, list_size)
            out[at] = 0x0A  # value (packed)
            at = _put_varint(out, at + 1, payload_size)
            out[at:at + payload_size] = scratch[payload_start:payload_ends[f]]
            at += payload_size
        _put_frame(out, record, at - record - 12)
        at += 4
        ends[i] = at
    return at


_HEADER_ROOM = 1 + 5  # a tag and a length of up to 2**35 bytes


def encode_framed(features: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(framed TFRecords of N tf.train.Example records, ends [N] of each record in them)."""
    num_records = len(next(iter(features.values())))
    arrays, is_float, room = [], [], 0
    for name, values in features.items():
        values = np.asarray(values).reshape(num_records, -1)
        is_float.append(values.dtype.kind == "f")
        if is_float[-1]:
            values = values.astype("<f4").view(np.int32)  # packed fixed32: the float's bits
            room += 4 * values.shape[1]
        else:
            top = int(values.max(initial=0))
            width = 10 if values.size and values.min() < 0 else max(1, (top.bit_length() + 6) // 7)
            room += width * values.shape[1]
        arrays.append(values)
        room += 5 * _HEADER_ROOM + len(name.encode())  # its headers
    dtype = np.result_type(*[a.dtype for a in arrays])  # one dtype: the features travel as one tuple
    arrays = tuple(np.ascontiguousarray(a, dtype=dtype) for a in arrays)
    keys = [name.encode() for name in features]
    scratch = np.empty(room + 2, dtype=np.uint8)  # + 2: _put_small_varint writes past a value
    out = np.empty(num_records * (room + 12 + _HEADER_ROOM + 4), dtype=np.uint8)
    ends = np.empty(num_records, dtype=np.int64)
    used = _encode(arrays, np.array(is_float), np.frombuffer(b"".join(keys), np.uint8),
                   np.cumsum([0] + [len(key) for key in keys]), scratch, out, ends)
    return out[:used], ends


def encode_examples(features: dict[str, np.ndarray]) -> list[bytes]:
    """Serializes N tf.train.Example records at once.

    Float features become FloatList, integer ones Int64List (packed, in the order given).

    >>> [r.hex() for r in encode_examples({"a": np.array([[1, 300], [2, 3]])})]
    ['0a0e0a0c0a016112071a050a0301ac02', '0a0d0a0b0a016112061a040a020203']

    Args:
      features: name -> array [N, length] (the N records' values).

    Returns:
      N serialized Examples.
    """
    if len(next(iter(features.values()))) == 0:
        return []
    data, ends = encode_framed(features)
    starts = np.r_[0, ends[:-1]]
    return [data[start + 12:end - 4].tobytes() for start, end in zip(starts.tolist(), ends.tolist())]



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
    # The largest legal record: every value a 10-byte varint (4 bytes a float), and its headers.
    largest = 16 + sum(len(name) + 24 + (4 if name in float_features else 10) * length
                       for name, length in lengths.items())
    for first, data, starts, sizes in read_record_batches(path, batch_size, max_record_bytes=largest):
        out = np.empty((len(starts), columns[-1]), np.int64)
        bad = _parse_examples(np.frombuffer(data, np.uint8), starts, sizes, names, name_starts, is_float, columns, out)
        if bad >= 0:
            records = [data[a:a + n] for a, n in zip(starts.tolist(), sizes.tolist())]
            yield first, _parse(path, first, records, float_features, lengths, flag_hint)
            continue
        batch = {}
        for f, name in enumerate(lengths):
            values = out[:, columns[f]:columns[f + 1]]
            batch[name] = values.astype(np.uint32).view(np.float32) if is_float[f] else values
        yield first, batch


def _parse(path, first, batch, float_features, lengths, flag_hint):
    tf = import_tensorflow()

    try:
        parsed = tf.io.parse_example(tf.constant(batch), tf_feature_spec(lengths, float_features))
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
        _raise_for_bad_record(path, first, batch, float_features, lengths, flag_hint)
        raise RecordError(f"{path}: records {first}-{first + len(batch) - 1}: TensorFlow cannot parse them "
                          f"({str(e).splitlines()[0]})") from None
    return {name: value.numpy() for name, value in parsed.items()}


def _raise_for_bad_record(path, first, batch, float_features, lengths, flag_hint):
    tf = import_tensorflow()

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
            kind = feature.WhichOneof("kind")
            wanted = "float_list" if name in float_features else "int64_list"
            if kind != wanted:
                raise RecordError(f"{where}: feature {name!r} is a {kind}, expected a {wanted}")
            found = len(feature.int64_list.value) or len(feature.float_list.value)
            if found != length:
                raise RecordError(f"{where}: feature {name!r} has {found} values, expected {length}"
                                  f"{flag_hint}")

