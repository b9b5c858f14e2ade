"""Paths are names, never patterns: `[`, `*`, `?`, `{`, spaces and unicode anywhere."""

import os

import numpy as np

from bert_packed import files

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
