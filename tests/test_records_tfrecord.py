import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def crc32c(data: bytes) -> int:
    """CRC-32C, bit by bit: an implementation independent of the compiled one."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> bytes:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")


def frame(record: bytes) -> bytes:
    header = len(record).to_bytes(8, "little")
    return header + masked_crc(header) + record + masked_crc(record)


def reference_records(data: bytes):
    """The TFRecord framing read by the book: the records, or None when the bytes are not a file of them."""
    records, at = [], 0
    while at < len(data):
        header = data[at:at + 8]
        if len(data) - at < 12 or data[at + 8:at + 12] != masked_crc(header):
            return None
        length = int.from_bytes(header, "little")
        end = at + 12 + length
        if end + 4 > len(data) or data[end:end + 4] != masked_crc(data[at + 12:end]):
            return None
        records.append(data[at + 12:end])
        at = end + 4
    return records


@pytest.mark.parametrize("declared", [2**63 + 5, 2**64 - 1, 4 << 30, 97])
def test_a_crafted_header_is_refused_before_anything_is_read(tmp_path, declared):
    """A header with a valid checksum that declares more than the file holds (negative as int64,
    4 GiB, just past the end): one error naming the record, no crash, no allocation."""
    header = declared.to_bytes(8, "little")
    path = tmp_path / "crafted.tfrecord"
    path.write_bytes(frame(b"ok") + header + masked_crc(header) + bytes(112 - 18 - 12))
    with pytest.raises(CorruptRecordError, match=rf"crafted.tfrecord: record 1: truncated data \(it declares "
                                                 rf"{declared:,} bytes"):
        list(read_records(str(path)))


def test_a_record_longer_than_its_features_allow_is_refused(tmp_path):
    from bert_packed.records import read_batches

    path = tmp_path / "long.tfrecord"
    path.write_bytes(frame(bytes(5000)))
    with pytest.raises(CorruptRecordError, match=r"record 0: declares 5,000 bytes, more than a record of these "
                                                 r"features can hold \(1,"):
        list(read_batches(str(path), {"ids": 100}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.binary(max_size=40), max_size=4), data=st.data())
def test_random_and_mutated_bytes_are_read_as_the_framing_says_or_refused(tmp_path, records, data):
    content = b"".join(frame(record) for record in records)
    mutation = data.draw(st.sampled_from(["none", "flip", "truncate", "insert", "length", "noise"]))
    if mutation == "flip" and content:
        at = data.draw(st.integers(0, len(content) - 1))
        content = content[:at] + bytes([content[at] ^ data.draw(st.integers(1, 255))]) + content[at + 1:]
    elif mutation == "truncate":
        content = content[:data.draw(st.integers(0, len(content)))]
    elif mutation == "insert":
        at = data.draw(st.integers(0, len(content)))
        content = content[:at] + data.draw(st.binary(min_size=1, max_size=20)) + content[at:]
    elif mutation == "length":  # a checked header that lies about the length
        header = data.draw(st.integers(0, 2**64 - 1)).to_bytes(8, "little")
        content += header + masked_crc(header) + data.draw(st.binary(max_size=30))
    elif mutation == "noise":
        content = data.draw(st.binary(max_size=200))
    path = tmp_path / "fuzz.tfrecord"
    path.write_bytes(content)
    expected = reference_records(content)
    if expected is None:
        with pytest.raises(CorruptRecordError) as info:
            list(read_records(str(path)))
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    else:
        assert list(read_records(str(path))) == expected
        assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == expected  # TensorFlow agrees


def test_a_compressed_file_says_it_is_compressed(tmp_path):
    import bz2
    import gzip

    path = tmp_path / "records.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        writer.write_all([b"first", b"second"])
    for kind, compress in (("gzip", gzip.compress), ("bzip2", bz2.compress)):
        compressed = tmp_path / f"records.{kind}"
        compressed.write_bytes(compress(path.read_bytes()))
        with pytest.raises(CorruptRecordError) as refused:
            list(read_records(str(compressed)))
        assert str(refused.value) == (f"{compressed}: {kind}-compressed; TFRecord files are read uncompressed: "
                                      f"decompress it first")
