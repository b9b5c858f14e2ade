"""TFRecord framing, read and written without TensorFlow: CRC-32C and the record frames.

A TFRecord file is a sequence of frames: uint64 length, masked CRC-32C of the length, the data,
masked CRC-32C of the data. The loops are small compiled functions (numba, nogil) so that data
preparation never imports TensorFlow and its threads use every core. example.py encodes and
parses the tf.train.Example records these frames hold.
"""

from __future__ import annotations

from collections.abc import Iterator

import numba
import numpy as np

from bert_packed.errors import UserError
from bert_packed.storage import files


class CorruptRecordError(UserError, ValueError):
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
        declared = _get_uint(data, at, 8)  # unsigned: no length reads backwards
        if _get_uint(data, at + 8, 4) != _masked_crc(data, at, at + 8):
            return count, at, 1
        room = len(data) - at - 16
        if room < 0 or declared > np.uint64(room):
            break
        length = np.int64(declared)
        if _get_uint(data, at + 12 + length, 4) != _masked_crc(data, at + 12, at + 12 + length):
            return count, at, 2
        starts[count], lengths[count] = at + 12, length
        count += 1
        at += 16 + length
    return count, at, 0


def read_record_batches(path: str, batch_size: int = 1024, block_bytes: int = 16 << 20,
                        max_record_bytes: int | None = None) -> Iterator[tuple[int, bytes, np.ndarray, np.ndarray]]:
    """Yields batches of the records of a TFRecord file, checking both checksums of each.

    The file is read in blocks; a batch is (index of its first record, a buffer, starts [n],
    lengths [n]): record k of the batch is buffer[starts[k]:starts[k] + lengths[k]]. A record's
    declared length is checked against what is left of the file (and `max_record_bytes`) before
    anything more is read, so no header can make the reader hold more than one block and one
    legal record.

    Raises:
      CorruptRecordError: naming the file and the record index where it broke.
    """
    index, consumed = 0, 0
    pending = b""
    size = files.size(path)
    with files.open_file(path, "rb") as f:
        while True:
            block = f.read(block_bytes)
            consumed += len(block)
            data = pending + block if pending else block
            buffer = np.frombuffer(data, np.uint8)
            starts = np.empty(len(data) // 16 + 1, np.int64)
            lengths = np.empty_like(starts)
            count, used, error = _unframe(buffer, starts, lengths)
            if max_record_bytes is not None and count and lengths[:count].max() > max_record_bytes:
                # Stop before the first record too long to be legal: the header check below names it.
                count = int(np.argmax(lengths[:count] > max_record_bytes))
                used, error = int(starts[count]) - 12, 0
            for k in range(0, count, batch_size):
                yield index + k, data, starts[k:min(count, k + batch_size)], lengths[k:min(count, k + batch_size)]
            index += count
            if error:
                what = "length" if error == 1 else "data"
                raise _corrupt(path, index, f"{what} checksum mismatch (corrupt file?)")
            pending = data[used:]
            if len(pending) >= 12:  # a checked header whose record is not yet read, or too long
                declared = int.from_bytes(pending[:8], "little")
                left = len(pending) + size - consumed
                if max_record_bytes is not None and declared > max_record_bytes:
                    raise CorruptRecordError(f"{path}: record {index}: declares {declared:,} bytes, more than a "
                                             f"record of these features can hold ({max_record_bytes:,})")
                if declared + 16 > left:
                    raise _corrupt(path, index, f"truncated data (it declares {declared:,} bytes, the file ends "
                                                f"{max(left - 16, 0):,} bytes after its header)")
            if not block:
                if pending:
                    raise _corrupt(path, index, "truncated header (file ends mid-record)")
                return


def _corrupt(path: str, index: int, what: str) -> CorruptRecordError:
    """The error of record `index`; a file whose first record breaks because it is compressed says
    so (TFRecord files are written, and read here, uncompressed)."""
    kind = files.compression(path) if index == 0 else None
    if kind:
        return CorruptRecordError(f"{path}: {kind}-compressed; TFRecord files are read uncompressed: decompress it "
                                  f"first")
    return CorruptRecordError(f"{path}: record {index}: {what}")


def read_records(path: str) -> Iterator[bytes]:
    """Yields the records of a TFRecord file, checking both checksums of each (see
    read_record_batches)."""
    for _, data, starts, lengths in read_record_batches(path):
        for start, length in zip(starts.tolist(), lengths.tolist()):
            yield data[start:start + length]
