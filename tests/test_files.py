"""Paths are names, never patterns: `[`, `*`, `?`, `{`, spaces and unicode anywhere."""

import errno
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_packed.errors import StorageError, UserError
from bert_packed.storage import files

ODD = "g [1]/ü *?{x}"


def test_a_glob_takes_the_existing_part_of_its_pattern_as_it_is(tmp_path):
    directory = tmp_path / ODD
    directory.mkdir(parents=True)
    for name in ("part-1.tfrecord", "part-2.tfrecord", "eval-1.tfrecord"):
        (directory / name).write_bytes(b"")
    (tmp_path / "a[1].tfrecord").write_bytes(b"")
    assert files.glob(str(directory / "part-*.tfrecord")) == [str(directory / "part-1.tfrecord"),
                                                              str(directory / "part-2.tfrecord")]
    assert files.glob(str(tmp_path / "a[1].tfrecord")) == [str(tmp_path / "a[1].tfrecord")]  # itself
    assert files.glob(str(tmp_path / "g [1]" / "*" / "eval-*")) == [str(directory / "eval-1.tfrecord")]
    assert files.glob(str(directory / "nothing-*")) == []


def test_tensorflow_reads_a_checkpoint_under_an_odd_path_through_a_plain_name(tmp_path):
    import tensorflow as tf

    directory = tmp_path / ODD
    directory.mkdir(parents=True)
    value = tf.Variable([1.0, 2.0, 3.0])
    prefix = tf.train.Checkpoint(v=value).write(str(directory / "ckpt-1"))
    with files.unglobbed(prefix) as readable:
        assert readable != prefix and not any(c in readable for c in "[]*?")
        restored = tf.Variable([0.0, 0.0, 0.0])
        tf.train.Checkpoint(v=restored).read(readable).assert_existing_objects_matched()
    np.testing.assert_array_equal(restored.numpy(), [1.0, 2.0, 3.0])
    assert not os.path.exists(readable)  # the links are gone with the block
    with files.unglobbed(str(tmp_path / "plain")) as same:
        assert same == str(tmp_path / "plain")


def test_leftovers_of_dead_writers_go_and_a_live_writer_s_stay(tmp_path):
    dead = 2**22 + 777
    names = [f".part-1.tfrecord.tmp-{dead}", f"packed-1.tfrecord.tmp-{dead}", f".run.json.tmp-{os.getpid()}",
             "part-1.tfrecord", ".lock", f".lock.tmp-{dead}"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / f".saving.tmp-{dead}").mkdir()
    removed = files.remove_leftovers(str(tmp_path))
    assert sorted(removed) == sorted([f".part-1.tfrecord.tmp-{dead}", f"packed-1.tfrecord.tmp-{dead}",
                                      f".saving.tmp-{dead}"])
    assert sorted(os.listdir(tmp_path)) == sorted([f".run.json.tmp-{os.getpid()}", "part-1.tfrecord", ".lock",
                                                   f".lock.tmp-{dead}"])
    with files.atomic_open(str(tmp_path / "x.json")) as f:
        assert os.path.basename(f.name).startswith(".x.json.tmp-")  # hidden from every data glob
        f.write("{}")


def test_what_the_storage_refuses_is_a_storage_error_naming_the_path_the_user_gave(tmp_path):
    with pytest.raises(StorageError, match=rf"^{tmp_path}/gone: No such file or directory$") as refused:
        files.size(str(tmp_path / "gone"))
    assert isinstance(refused.value, UserError) and not refused.value.retry_may_help
    with pytest.raises(StorageError, match=rf"^{tmp_path}: Is a directory$"):
        files.write_text_atomically(str(tmp_path), "x")  # the user's path, not the temporary name beside it
    with pytest.raises(StorageError, match=r"^/dev/full: No space left on device$") as full:
        with files.open_file("/dev/full", "w") as f:  # the write of an open file too, when it reaches the disk
            f.write("x" * 65536)
            f.flush()
    assert full.value.disk_full and full.value.errno == errno.ENOSPC
    with pytest.raises(StorageError, match=r"^file:///nowhere/x: No such file or directory$"):
        files.open_file("file:///nowhere/x")
    with pytest.raises(StorageError, match=r"^/dev/zero: not a regular file \(a device or a pipe\)$"):
        files.open_file("/dev/zero")  # read as JSON, it never ends
    # TensorFlow's filesystems begin their words with the path they were given, a temporary one too.
    with pytest.raises(StorageError, match=r"^file:///d/x: Permission denied$"):
        with files.storage("file:///d/x"):
            raise tf.errors.PermissionDeniedError(None, None, "file:///d/.x.tmp-12; Permission denied")
    with pytest.raises(tf.errors.ResourceExhaustedError):  # out of memory in a storage block is no full disk
        with files.storage("file:///d/x"):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    # A bucket's client that still failed after its retries: the same command again may go on.
    with pytest.raises(StorageError) as unavailable:
        with files.storage("gs://b/x"):
            raise tf.errors.UnavailableError(None, None, "HTTP response code 503\nmore")
    assert (unavailable.value.retry_may_help, str(unavailable.value), unavailable.value.kind) == (
        True, "gs://b/x: HTTP response code 503", "UnavailableError")
    # Anything else goes on as it is: a bug met in a block of storage requests is still a bug.
    with pytest.raises(KeyError):
        with files.storage("gs://b/x"):
            raise KeyError("x")


def test_an_input_error_that_is_not_the_storage_s_goes_on_as_it_is():
    """Out of memory in the input's iterator is neither a storage error nor bad data (it was raised
    as `raise None`: a TypeError)."""
    from types import SimpleNamespace

    from bert_packed.training.input_pipeline import reading_errors_named

    with pytest.raises(tf.errors.ResourceExhaustedError, match="OOM"):
        with reading_errors_named(SimpleNamespace(identity=(), files=())):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating, in IteratorGetNext")
