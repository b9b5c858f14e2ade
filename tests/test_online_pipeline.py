"""Packing on the fly (input mode packed_online): every sequence of an epoch once, shuffled and
deterministic for a seed, shared among input pipelines, resumed exactly, static shapes, and an
evaluation packed on the fly that gives the unpacked figures."""


import numpy as np
import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, MAX_SEQUENCES_PER_PACK, tfrecords

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.packing import packer, plan
from bert_packed.packing.stream import StreamSettings, length_histogram, packed_batches
from bert_packed.records import RecordError, read_unpacked

SHAPES = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)


@pytest.fixture(scope="module")
def stream(unpacked_dir):
    paths = tfrecords(unpacked_dir)
    histogram = length_histogram(paths, SHAPES)
    return paths, histogram, plan(histogram, MAX_SEQ_LENGTH, "lp", MAX_SEQUENCES_PER_PACK)


def sequences_of(batches):
    return np.concatenate([packer.unpack(batch, SHAPES.unpacked()) for batch in batches])


def input_rows(paths):
    return np.concatenate([packer.rows_from_unpacked(batch, SHAPES.unpacked(), 0, 0) for path in paths
                           for _, batch in read_unpacked(path, SHAPES.unpacked())])


def test_every_sequence_of_an_epoch_once_in_full_static_packs(stream):
    paths, histogram, p = stream
    settings = StreamSettings(SHAPES, p.strategies, 1000, 4, seed=3, epochs=2, shuffle_buffer=64, read_batch=16)
    batches = list(packed_batches(paths, settings))
    assert all(b["input_ids"].shape == (4, MAX_SEQ_LENGTH) and b["input_ids"].dtype == np.int32 for b in batches)
    rows, expected = sequences_of(batches), input_rows(paths)
    assert len(rows) == 2 * len(expected) == 2 * int(histogram.sum()) == 244
    assert packer.checksum(rows) == 2 * packer.checksum(expected) % (1 << 64)  # each sequence once an epoch
    tokens = sum(int((b["input_mask"] > 0).sum()) for b in batches)
    assert tokens / (len(batches) * 4 * MAX_SEQ_LENGTH) >= p.efficiency - 0.01  # the plan's efficiency, nearly


def test_shuffled_and_deterministic_for_a_seed(stream):
    paths, _, p = stream

    def first(seed, count=6):
        settings = StreamSettings(SHAPES, p.strategies, 1000, 4, seed=seed, shuffle_buffer=64, read_batch=16)
        return [b["input_ids"] for _, b in zip(range(count), packed_batches(paths, settings))]

    same, again, other = first(1), first(1), first(2)
    assert all(np.array_equal(a, b) for a, b in zip(same, again))
    assert not all(np.array_equal(a, b) for a, b in zip(same, other))


def test_a_resumed_stream_goes_on_with_the_batches_an_uninterrupted_one_gives(stream):
    paths, _, p = stream
    settings = StreamSettings(SHAPES, p.strategies, 1000, 4, seed=5, shuffle_buffer=64, read_batch=16)
    straight = [b for _, b in zip(range(40), packed_batches(paths, settings))]  # past an epoch: 122 sequences
    resumed = [b for _, b in zip(range(15), packed_batches(paths, StreamSettings(**{
        **settings.__dict__, "skip_batches": 25})))]
    for a, b in zip(straight[25:], resumed, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


def test_evaluation_packs_every_record_once_and_fills_its_last_batch_with_empty_packs(stream):
    paths, histogram, p = stream
    batches = list(packed_batches(paths, StreamSettings(SHAPES, p.strategies, 1000, 8, training=False)))
    rows = sequences_of(batches)
    assert len(rows) == int(histogram.sum()) and packer.checksum(rows) == packer.checksum(input_rows(paths))
    last = batches[-1]
    assert (last["next_sentence_weights"].sum(axis=1) == 0).any()  # empty packs count nothing


def test_bad_input_is_one_line(stream, tmp_path):
    paths, _, p = stream
    with pytest.raises(SettingsError, match=r"--online_packing_window=2 is too small"):
        next(packed_batches(paths, StreamSettings(SHAPES, p.strategies, 2, 4)))
    longer = Shapes(MAX_SEQ_LENGTH // 2, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)  # records longer than this L
    with pytest.raises(RecordError, match=rf"{paths[0]}: record 0: .*input_ids"):
        next(packed_batches(paths, StreamSettings(longer, ((tuple([64]), 1),), 100, 4, training=False)))
    # Three sequences of 25 tokens fit a pack, but not their 3 x 20 predictions (P + S = 23).
    path = tmp_path / "dense.tfrecord"
    count, length = 3, 25
    features = {name: np.zeros((count, size), np.int64) for name, size in SHAPES.unpacked_lengths().items()}
    features["masked_lm_weights"] = np.zeros((count, MAX_PREDICTIONS), np.float32)
    features["input_ids"][:, :length] = 1000
    features["input_mask"][:, :length] = 1
    features["masked_lm_positions"][:] = np.arange(1, MAX_PREDICTIONS + 1)
    features["masked_lm_ids"][:] = 2000
    features["masked_lm_weights"][:] = 1.0
    from bert_packed.records import TFRecordWriter

    with TFRecordWriter(str(path)) as writer:
        writer.write_examples(features)
    dense = plan(length_histogram([str(path)], SHAPES), MAX_SEQ_LENGTH, "lp", 3)
    with pytest.raises(RecordError, match=rf"{path}: record \d: its pack holds more than 23 predictions \(P \+ S\)"):
        list(packed_batches([str(path)], StreamSettings(SHAPES, dense.strategies, 100, 4, training=False)))


def test_the_input_pipeline_feeds_packs_on_the_fly_and_shares_files_among_pipelines(stream):
    import tensorflow as tf

    from bert_packed.training.input_pipeline import PipelineConfig, make_dataset

    paths, _, p = stream
    config = PipelineConfig(tuple(paths), SHAPES, "packed_online", 4, True, seed=1, strategies=p.strategies,
                            online_packing_window=1000)
    batch = next(iter(make_dataset(config)))
    assert {name: tuple(value.shape) for name, value in batch.items()} == {
        name: (4, length) for name, length in SHAPES.model_lengths().items()}
    assert all(value.dtype == tf.int32 for value in batch.values())
    shares = [make_dataset(config, tf.distribute.InputContext(2, index, 2)) for index in range(2)]
    first = [next(iter(share))["input_ids"].numpy() for share in shares]
    assert first[0].shape == (2, MAX_SEQ_LENGTH) and not np.array_equal(first[0], first[1])


def test_an_evaluation_packed_on_the_fly_gives_the_unpacked_figures(unpacked_dir, packed_dir, tmp_path):
    from training_runs import assert_same_evaluation, config, make_trainer

    from bert_packed.training import data

    eval_files = Dataset.described(tfrecords(unpacked_dir), "--eval_files")
    online = data.eval_data(eval_files, SHAPES, config("x", [], eval_input_mode="packed_online").config)
    padded = data.eval_data(eval_files, SHAPES, config("x", []).config)
    assert (online.input_mode, padded.input_mode) == ("packed_online", "padded")
    packed_trainer = make_trainer(dataclass_replace(config(tmp_path / "a", tfrecords(packed_dir)), eval_data=online))
    padded_trainer = make_trainer(dataclass_replace(config(tmp_path / "b", tfrecords(packed_dir)), eval_data=padded))
    assert_same_evaluation(packed_trainer, padded_trainer, num_sequences=122)


def dataclass_replace(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


@pytest.mark.slow  # trains packed on the fly, stops and resumes (over 3.5 s here)
def test_training_packed_on_the_fly_resumes_exactly_and_counts_the_plan_once(unpacked_dir, tmp_path, capsys):
    """The reference's own files (no metadata.json): the histogram is counted once and cached
    beside the run; a run stopped by SIGTERM goes on with exactly the losses of an uninterrupted one."""
    import shutil

    from training_runs import config, give_back, make_trainer, read_log, sigterm_in_the_loop_from, trained

    from bert_packed.storage.run_directory import RunDirectory
    from bert_packed.training import data

    bare = tmp_path / "bare"
    bare.mkdir()
    for path in tfrecords(unpacked_dir):
        shutil.copy(path, bare)
    paths = tfrecords(str(bare))

    def setup(directory, window=200):
        given = config(directory, paths, num_train_steps=6, input_mode="packed_online", adjust_batch_for_packing=True,
                       online_packing_window=window)
        train = data.train_data(Dataset.described(paths, "--input_file"), SHAPES, given.config,
                                run=RunDirectory(str(directory)))
        return dataclass_replace(given, train_data=train)

    straight = make_trainer(setup(tmp_path / "straight"))
    assert "counting the sequences of 4 files (once: the run directory keeps their lengths): 4/4 files" in capsys.readouterr().err
    assert straight.compiled.batching.rows_per_micro_batch == 3  # 4 rows at the plan's packing factor
    straight.train()
    give_back(straight)
    stopped = make_trainer(setup(tmp_path / "resumed"))
    sigterm_in_the_loop_from(stopped, 2)
    stopped.train()
    assert stopped.stopped_by == "SIGTERM"
    give_back(stopped)
    capsys.readouterr()
    trained(setup(tmp_path / "resumed"))
    assert "counting" not in capsys.readouterr().err  # the histogram cached beside the run
    logs = [read_log(tmp_path / run / "train_log.jsonl") for run in ("straight", "resumed")]
    assert [r["step"] for r in logs[1]] == list(range(1, 7))
    assert [r["loss"] for r in logs[0]] == [r["loss"] for r in logs[1]]
    assert [r["sequences"] for r in logs[0]] == [r["sequences"] for r in logs[1]]
    assert logs[0][-1]["sequences"] / (6 * 3) > 1.1  # several sequences a pack
    # Another window makes other packs: the run is not resumed with it.
    from bert_packed.storage.run_directory import RunError

    with pytest.raises(RunError, match=r"holds another run \(online_packing_window: \d+ there, 100 here\)"):
        trained(setup(tmp_path / "resumed", window=100))
