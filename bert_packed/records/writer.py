"""TFRecordWriter: tf.train.Example records into a TFRecord file, written atomically."""

from __future__ import annotations

import contextlib

import numpy as np

from bert_packed.records.example import encode_framed
from bert_packed.records.tfrecord import _frame
from bert_packed.storage.files import atomic_open


class TFRecordWriter:
    """Writes records to `path` through a temporary file, renamed into place at the end.

    Use as a context manager: on an exception the temporary file is removed and nothing named
    `path` appears, so an interrupted run leaves nothing that looks finished (files.atomic_open).

    Attributes:
      path: the file written.
      num_records: records written so far.
    """

    def __init__(self, path: str):
        self.path = path
        self.num_records = 0
        self._stack = contextlib.ExitStack()
        self._file = None

    def __enter__(self):
        self._file = self._stack.enter_context(atomic_open(self.path, "wb"))
        return self

    def __exit__(self, exc_type, exc, tb):
        return self._stack.__exit__(exc_type, exc, tb)

    def write(self, record: bytes) -> None:
        self.write_all([record])

    def write_examples(self, features: dict[str, np.ndarray]) -> None:
        """Writes N tf.train.Example records (see example.encode_examples) with one system call."""
        num_records = len(next(iter(features.values())))
        if num_records:
            self._write(encode_framed(features)[0])
        self.num_records += num_records

    def write_all(self, records: list[bytes]) -> None:
        """Frames and writes records with one system call."""
        sizes = np.array([len(record) for record in records], dtype=np.int64)
        ends = np.cumsum(sizes)
        out = np.empty(int(ends[-1] if len(ends) else 0) + 16 * len(records), dtype=np.uint8)
        _frame(np.frombuffer(b"".join(records), np.uint8), ends - sizes, ends, out)
        self._write(out)
        self.num_records += len(records)

    def _write(self, data: np.ndarray) -> None:
        # A local file takes the array's buffer as it is; a tf.io.gfile file wants bytes.
        self._file.write(data if hasattr(self._file, "fileno") else data.tobytes())
