import numpy as np
import pytest
import tensorflow as tf

from bert_packed.records import CorruptRecordError, TFRecordWriter, encode_examples, read_records
from bert_packed.records.tfrecord import _masked_crc


def test_encoded_examples_parse_back_with_tensorflow():
    rng = np.random.default_rng(0)
    ints = rng.integers(0, 2**40, size=(5, 33))
    ints[:, :4] = [0, 127, 128, 30521]
    ints[0, 4:7] = [-1, -(2**63), 2**63 - 1]
    floats = rng.random((5, 7)).astype(np.float32)
    small = rng.integers(0, 2, size=(5, 9))
    records = encode_examples({"ints": ints, "floats": floats, "small": small})
    for row, record in enumerate(records):
        features = tf.train.Example.FromString(record).features.feature
        assert list(features["ints"].int64_list.value) == ints[row].tolist()
        assert list(features["small"].int64_list.value) == small[row].tolist()
        np.testing.assert_array_equal(np.array(features["floats"].float_list.value, dtype=np.float32), floats[row])


def test_written_files_read_back_with_tf_data_and_our_reader(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    records = encode_examples({"a": np.arange(12).reshape(4, 3)})
    with TFRecordWriter(path) as writer:
        writer.write_all(records[:3])
        writer.write(records[3])
    assert [r.numpy() for r in tf.data.TFRecordDataset(path)] == records
    assert list(read_records(path)) == records


def test_write_examples_frames_the_same_records_as_write_all(tmp_path):
    rng = np.random.default_rng(1)
    features = {"ids": rng.integers(0, 2**22, size=(50, 40)), "mask": rng.integers(0, 4, size=(50, 40)),
                "weights": rng.random((50, 3)).astype(np.float32)}
    with TFRecordWriter(str(tmp_path / "a")) as writer:
        writer.write_examples(features)
    with TFRecordWriter(str(tmp_path / "b")) as writer:
        writer.write_all(encode_examples(features))
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    assert writer.num_records == 50
    first = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(str(tmp_path / "a")))).numpy())
    assert list(first.features.feature["ids"].int64_list.value) == features["ids"][0].tolist()


def test_a_failed_writer_leaves_nothing(tmp_path):
    path = tmp_path / "x.tfrecord"
    with pytest.raises(RuntimeError):
        with TFRecordWriter(str(path)) as writer:
            writer.write(b"abc")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:-3], "record 2: truncated data"),
    (lambda data: data[:2 * 26 + 5], "record 2: truncated header"),
    (lambda data: data[:20] + bytes([data[20] ^ 1]) + data[21:], "record 0: data checksum mismatch"),
    (lambda data: data[:2] + bytes([data[2] ^ 1]) + data[3:], "record 0: length checksum mismatch"),
])
def test_corrupt_and_truncated_files_name_file_and_record(tmp_path, damage, message):
    path = tmp_path / "x.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        writer.write_all([b"0123456789"] * 3)  # 26 bytes a record
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CorruptRecordError, match=message) as info:
        list(read_records(str(path)))
    assert str(path) in str(info.value)


def test_crc32c_matches_the_standard_check_value():
    crc = 0xE3069283  # CRC-32C of b"123456789" (RFC 3720 / iSCSI)
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF  # TFRecord's masking
    assert _masked_crc(np.frombuffer(b"123456789", np.uint8), 0, 9) == masked
