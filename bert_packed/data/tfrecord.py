"""TFRecord files of tf.train.Example records, written, framed and read without TensorFlow.

Building a tf.train.Example through the protobuf API costs ~180 us for one BERT record at
L=512. Here small compiled loops (numba) serialize and frame a packed record in ~30 us
(scripts/benchmark_pack_pretraining_data.py), and keep data preparation free of a 7 s TensorFlow
import. reader.py parses the records read here.

TFRecord framing: uint64 length, masked crc32c of the length, data, masked crc32c of the data.
Example layout, as written here: Example{features=1: Features{feature=1 (one map entry per
feature){key=1: name, value=2: Feature{float_list=2 | int64_list=3: {value=1, packed}}}}}."""

from __future__ import annotations

import os
from typing import Iterator

import numba
import numpy as np


class CorruptRecordError(ValueError):
    """A TFRecord file is truncated or fails its checksums."""


def _crc32c_tables() -> np.ndarray:
    """Slicing-by-8 tables of CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    tables = np.zeros((8, 256), dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        tables[0, byte] = crc
    for k in range(1, 8):
        tables[k] = (tables[k - 1] >> 8) ^ tables[0][tables[k - 1] & 0xFF]
    return tables


_CRC32C_TABLES = _crc32c_tables()


@numba.njit(cache=True, nogil=True)
def _masked_crc(data, start, end):
    """TFRecord's masked CRC-32C of data[start:end] (eight bytes a step)."""
    t = _CRC32C_TABLES
    crc = np.uint32(0xFFFFFFFF)
    at = start
    while at + 8 <= end:
        crc ^= (np.uint32(data[at]) | np.uint32(data[at + 1]) << 8 | np.uint32(data[at + 2]) << 16
                | np.uint32(data[at + 3]) << 24)
        crc = (t[7, crc & 0xFF] ^ t[6, (crc >> 8) & 0xFF] ^ t[5, (crc >> 16) & 0xFF] ^ t[4, crc >> 24]
               ^ t[3, data[at + 4]] ^ t[2, data[at + 5]] ^ t[1, data[at + 6]] ^ t[0, data[at + 7]])
        at += 8
    while at < end:
        crc = t[0, (crc ^ data[at]) & 0xFF] ^ (crc >> 8)
        at += 1
    crc = np.uint64(crc ^ np.uint32(0xFFFFFFFF))
    return (((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)


@numba.njit(cache=True, nogil=True)
def _put_uint(out, at, value, size):
    for k in range(size):
        out[at + k] = (value >> (8 * k)) & 0xFF


@numba.njit(cache=True, nogil=True)
def _get_uint(data, at, size):
    value = np.uint64(0)
    for k in range(size):
        value |= np.uint64(data[at + k]) << np.uint64(8 * k)
    return value


@numba.njit(cache=True, nogil=True)
def _put_frame(out, at, size):
    """Frames the `size` bytes at out[at + 12:]: the length and both checksums around them."""
    _put_uint(out, at, size, 8)
    _put_uint(out, at + 8, _masked_crc(out, at, at + 8), 4)
    _put_uint(out, at + 12 + size, _masked_crc(out, at + 12, at + 12 + size), 4)


@numba.njit(cache=True, nogil=True)
def _frame(data, starts, ends, out):
    """Writes records data[starts[i]:ends[i]] into `out` as TFRecords."""
    at = 0
    for i in range(len(starts)):
        size = ends[i] - starts[i]
        out[at + 12:at + 12 + size] = data[starts[i]:ends[i]]
        _put_frame(out, at, size)
        at += 16 + size


@numba.njit(cache=True, nogil=True)
def _unframe(data, starts, lengths):
    """Finds the complete TFRecords in `data`, checking both checksums of each.

    Returns:
      (records found, their bytes used, error): error 1 means the next record's length checksum
      fails, 2 its data checksum; 0 that the records stop at a clean end or mid-record.
    """
    at, count = 0, 0
    while at + 12 <= len(data) and count < len(starts):
        length = np.int64(_get_uint(data, at, 8))
        if _get_uint(data, at + 8, 4) != _masked_crc(data, at, at + 8):
            return count, at, 1
        if length > len(data) - at - 16:
            break
        if _get_uint(data, at + 12 + length, 4) != _masked_crc(data, at + 12, at + 12 + length):
            return count, at, 2
        starts[count], lengths[count] = at + 12, length
        count += 1
        at += 16 + length
    return count, at, 0


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


def _encode_features(features: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
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
    data, ends = _encode_features(features)
    starts = np.r_[0, ends[:-1]]
    return [data[start + 12:end - 4].tobytes() for start, end in zip(starts.tolist(), ends.tolist())]


class TFRecordWriter:
    """Writes records to `path` through a temporary file, renamed into place by close().

    Use as a context manager: on an exception the temporary file is removed and nothing named
    `path` appears, so an interrupted run leaves nothing that looks finished.
    """

    def __init__(self, path: str):
        self.path = path
        self._tmp = f"{path}.tmp-{os.getpid()}"
        self._file = open(self._tmp, "wb")
        self.num_records = 0

    def write(self, record: bytes) -> None:
        self.write_all([record])

    def write_examples(self, features: dict[str, np.ndarray]) -> None:
        """Writes N tf.train.Example records (see encode_examples) with one system call."""
        num_records = len(next(iter(features.values())))
        if num_records:
            self._file.write(_encode_features(features)[0])
        self.num_records += num_records

    def write_all(self, records: list[bytes]) -> None:
        """Frames and writes records with one system call."""
        sizes = np.array([len(record) for record in records], dtype=np.int64)
        ends = np.cumsum(sizes)
        out = np.empty(int(ends[-1] if len(ends) else 0) + 16 * len(records), dtype=np.uint8)
        _frame(np.frombuffer(b"".join(records), np.uint8), ends - sizes, ends, out)
        self._file.write(out)
        self.num_records += len(records)

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_record_batches(path: str, batch_size: int = 1024, block_bytes: int = 16 << 20
                        ) -> Iterator[tuple[int, bytes, np.ndarray, np.ndarray]]:
    """Yields batches of the records of a TFRecord file, checking both checksums of each.

    The file is read in blocks; a batch is (index of its first record, a buffer, starts [n],
    lengths [n]): record k of the batch is buffer[starts[k]:starts[k] + lengths[k]].

    Raises:
      CorruptRecordError: naming the file and the record index where it broke.
    """
    index = 0
    pending = b""
    with open(path, "rb") as f:
        while True:
            block = f.read(block_bytes)
            data = pending + block if pending else block
            buffer = np.frombuffer(data, np.uint8)
            starts = np.empty(len(data) // 16 + 1, np.int64)
            lengths = np.empty_like(starts)
            count, used, error = _unframe(buffer, starts, lengths)
            for k in range(0, count, batch_size):
                yield index + k, data, starts[k:min(count, k + batch_size)], lengths[k:min(count, k + batch_size)]
            index += count
            if error:
                what = "length" if error == 1 else "data"
                raise CorruptRecordError(f"{path}: record {index}: {what} checksum mismatch (corrupt file?)")
            pending = data[used:]
            if not block:
                if pending:
                    what = "header" if len(pending) < 12 else "data"
                    raise CorruptRecordError(f"{path}: record {index}: truncated {what} (file ends mid-record)")
                return


def read_records(path: str) -> Iterator[bytes]:
    """Yields the records of a TFRecord file, checking both checksums of each (see
    read_record_batches)."""
    for _, data, starts, lengths in read_record_batches(path):
        for start, length in zip(starts.tolist(), lengths.tolist()):
            yield data[start:start + length]
