"""TFRecord files of tf.train.Example records, framed, encoded and parsed without TensorFlow.

  tfrecord.py   framing and CRC-32C; reading raw records, checked
  example.py    the tf.train.Example encoder and parser (compiled)
  writer.py     TFRecordWriter (atomic: a temporary file, then a rename)
  reader.py     unpacked and packed pre-training records as checked NumPy batches
"""

from bert_packed.records.example import RecordError, encode_examples, read_batches
from bert_packed.records.reader import read_packed, read_unpacked
from bert_packed.records.tfrecord import CorruptRecordError, read_record_batches, read_records
from bert_packed.records.writer import TFRecordWriter

__all__ = [
    "CorruptRecordError", "RecordError", "TFRecordWriter", "encode_examples", "read_batches", "read_packed",
    "read_record_batches", "read_records", "read_unpacked",
]
