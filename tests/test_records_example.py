"""The compiled tf.train.Example parser against TensorFlow's, on records written by TensorFlow."""

import numpy as np
import pytest
import tensorflow as tf

from bert_packed.records import RecordError, read_batches, read_record_batches
from bert_packed.records import example as reader


def write_with_tensorflow(path, examples):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for features in examples:
            feature = {}
            for name, values in features.items():
                if isinstance(values, bytes):
                    feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[values]))
                elif isinstance(values[0], float):
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
                else:
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def fast_path_takes(path, lengths, float_features=()):
    """Whether the compiled parser parsed every batch of the file itself."""
    encoded = [name.encode() for name in lengths]
    for _, data, starts, sizes in read_record_batches(str(path)):
        out = np.empty((len(starts), sum(lengths.values())), np.int64)
        bad = reader._parse_examples(np.frombuffer(data, np.uint8), starts, sizes,
                                     np.frombuffer(b"".join(encoded), np.uint8),
                                     np.cumsum([0] + [len(n) for n in encoded]),
                                     np.array([n in float_features for n in lengths]),
                                     np.cumsum([0] + list(lengths.values())), out)
        if bad >= 0:
            return False
    return True


def test_records_from_tensorflow_parse_like_tensorflow_parses_them(tmp_path):
    """Another key order, a feature nobody asked for, negative and 64-bit ints, floats."""
    rng = np.random.default_rng(0)
    examples = [{"extra": b"ignored", "weights": rng.normal(size=3).tolist(),
                 "ids": [int(v) for v in rng.integers(-2**62, 2**62, 5)] + [0, 127, 128, -1]} for _ in range(7)]
    write_with_tensorflow(tmp_path / "x.tfrecord", examples)
    lengths = {"ids": 9, "weights": 3}
    assert fast_path_takes(tmp_path / "x.tfrecord", lengths, ("weights",))
    [(first, batch)] = list(read_batches(str(tmp_path / "x.tfrecord"), lengths, ("weights",)))
    assert first == 0 and batch["ids"].dtype == np.int64 and batch["weights"].dtype == np.float32
    np.testing.assert_array_equal(batch["ids"], [e["ids"] for e in examples])
    np.testing.assert_array_equal(batch["weights"], np.array([e["weights"] for e in examples], np.float32))


def test_a_missing_feature_or_wrong_length_is_named_through_tensorflow(tmp_path):
    write_with_tensorflow(tmp_path / "x.tfrecord", [{"ids": [1, 2, 3]}, {"ids": [1, 2]}, {"other": [1]}])
    assert not fast_path_takes(tmp_path / "x.tfrecord", {"ids": 3})
    with pytest.raises(RecordError, match=r"x.tfrecord: record 1: feature 'ids' has 2 values, expected 3"):
        list(read_batches(str(tmp_path / "x.tfrecord"), {"ids": 3}))
    write_with_tensorflow(tmp_path / "y.tfrecord", [{"ids": [1, 2, 3]}, {"other": [1]}])
    with pytest.raises(RecordError, match=r"y.tfrecord: record 1: has no feature 'ids'"):
        list(read_batches(str(tmp_path / "y.tfrecord"), {"ids": 3}))


def test_unpacked_repeated_values_parse(tmp_path):
    """Int64List/FloatList values one field each (legal protobuf, though writers pack them)."""
    from bert_packed.records import TFRecordWriter

    ints = bytes.fromhex("1a04" "0805" "0806")  # int64_list {value: 5, value: 6}
    floats = bytes.fromhex("120a" "0d0000c03f" "0d000020c0")  # float_list {value: 1.5, value: -2.5}
    entries = b"".join(b"\x0a" + bytes([len(entry)]) + entry for entry in [
        b"\x0a\x01a\x12" + bytes([len(ints)]) + ints, b"\x0a\x01b\x12" + bytes([len(floats)]) + floats])
    record = b"\x0a" + bytes([len(entries)]) + entries
    with TFRecordWriter(str(tmp_path / "x.tfrecord")) as writer:
        writer.write_all([record, record])
    assert fast_path_takes(tmp_path / "x.tfrecord", {"a": 2, "b": 2}, ("b",))
    [(_, batch)] = list(read_batches(str(tmp_path / "x.tfrecord"), {"a": 2, "b": 2}, ("b",)))
    assert batch["a"].tolist() == [[5, 6], [5, 6]] and batch["b"].tolist() == [[1.5, -2.5], [1.5, -2.5]]
    parsed = tf.io.parse_example([record], {"a": tf.io.FixedLenFeature([2], tf.int64),
                                            "b": tf.io.FixedLenFeature([2], tf.float32)})
    assert parsed["a"].numpy().tolist() == [[5, 6]] and parsed["b"].numpy().tolist() == [[1.5, -2.5]]
