import numpy as np
import pytest
import tensorflow as tf
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, MAX_SEQUENCES_PER_PACK, tfrecords

from bert_packed.errors import TrainingError
from bert_packed.features import Shapes, record_features
from bert_packed.inputs.file_identity import DataChangedError, FileIdentity
from bert_packed.packing import packer
from bert_packed.records import CorruptRecordError, read_packed, read_unpacked
from bert_packed.training.input_pipeline import PipelineConfig, diagnose_input_error, make_dataset, reading_errors_named

PACKED = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)
UNPACKED = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS)


def one_epoch(config, **overrides):
    config = PipelineConfig(**{**config.__dict__, "is_training": False, **overrides})
    return [{k: v.numpy() for k, v in batch.items()} for batch in make_dataset(config)]


def sequences(batches, shapes=UNPACKED):
    """Decode batches of the packed layout (any mode) back to sorted sequence contents."""
    rows = []
    for batch in batches:
        width = batch["input_ids"].shape[1]
        if width < shapes.max_seq_length:  # bucketed batches are trimmed: pad back for decoding
            batch = {k: np.pad(v, [(0, 0), (0, shapes.max_seq_length - width)]) if v.shape[1] == width else v
                     for k, v in batch.items()}
        rows.append(packer.unpack(record_features(batch), shapes))
    rows = np.concatenate(rows)
    fields = ("length", "num_predictions", "next_sentence_label", "input_ids", "segment_ids",
              "masked_lm_positions", "masked_lm_ids")
    return sorted(tuple(np.concatenate([np.atleast_1d(r[f]) for f in fields]).tolist()) for r in rows)


@pytest.fixture(scope="module")
def configs(unpacked_dir, packed_dir):
    return {
        "packed": PipelineConfig(tuple(tfrecords(packed_dir)), PACKED, "packed", batch_size=4),
        "padded": PipelineConfig(tuple(tfrecords(unpacked_dir)), UNPACKED, "padded", batch_size=4),
        "bucketed": PipelineConfig(tuple(tfrecords(unpacked_dir)), UNPACKED, "bucketed", batch_size=4,
                                   bucket_boundaries=(32, 64, 96)),
    }


def test_every_mode_yields_the_same_sequences_in_the_same_layout(configs):
    epochs = {mode: one_epoch(config) for mode, config in configs.items()}
    assert sequences(epochs["packed"]) == sequences(epochs["padded"]) == sequences(epochs["bucketed"])
    assert len(sequences(epochs["padded"])) == 122
    for _mode, batches in epochs.items():
        assert set(batches[0]) == {"input_ids", "sequence_ids", "segment_ids", "positions", "masked_lm_positions",
                                   "masked_lm_ids", "prediction_sequence_ids", "next_sentence_positions",
                                   "next_sentence_labels", "next_sentence_weights"}
        assert all(v.dtype == np.int32 for v in batches[0].values())
    padded = epochs["padded"][0]
    lengths = padded["sequence_ids"].sum(axis=1)
    assert padded["positions"][0, :lengths[0]].tolist() == list(range(lengths[0]))
    assert padded["masked_lm_positions"].shape[1] == MAX_PREDICTIONS and padded["next_sentence_weights"].shape[1] == 1
    assert epochs["packed"][0]["masked_lm_positions"].shape[1] == MAX_PREDICTIONS + MAX_SEQUENCES_PER_PACK


@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_the_model_keys_hold_their_records_keys_values(configs, mode):
    """sequence_ids is each record's input_mask and prediction_sequence_ids its masked_lm_weights
    (a packed record's sequence indices; an unpacked record's 1 where the float weight is > 0);
    every other key a record has keeps its name and values."""
    config = PipelineConfig(**{**configs[mode].__dict__, "deterministic": True, "cycle_length": 1})
    parsed = one_epoch(config)  # files in order, one at a time: the records' order
    read, shapes = (read_packed, PACKED) if mode == "packed" else (read_unpacked, UNPACKED)
    batches = [batch for path in config.files for _, batch in read(path, shapes)]
    records = {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}
    if mode == "padded":  # float weights on disk
        records["masked_lm_weights"] = (records["masked_lm_weights"] > 0).astype(int)
    renamed = {"input_mask": "sequence_ids", "masked_lm_weights": "prediction_sequence_ids"}
    for name, values in records.items():
        np.testing.assert_array_equal(np.concatenate([batch[renamed.get(name, name)] for batch in parsed]), values,
                                      err_msg=name)


def test_bucketed_batches_are_trimmed_to_a_boundary(configs):
    for batch in one_epoch(configs["bucketed"]):
        width = batch["input_ids"].shape[1]
        lengths = batch["sequence_ids"].sum(axis=1)
        assert width in (32, 64, 96, 128)
        assert lengths.max() <= width and (width == 32 or lengths.min() > {64: 32, 96: 64, 128: 96}[width])


def test_training_batches_are_full_and_repeat(configs):
    config = PipelineConfig(**{**configs["packed"].__dict__, "batch_size": 16})
    batches = list(make_dataset(config).take(20))  # more than one epoch of ~100 packs
    assert all(b["input_ids"].shape == (16, MAX_SEQ_LENGTH) for b in batches)


def test_deterministic_runs_repeat_exactly_and_seeds_differ(configs):
    config = PipelineConfig(**{**configs["padded"].__dict__, "deterministic": True})
    first = [b["input_ids"].numpy() for b in make_dataset(config).take(5)]
    again = [b["input_ids"].numpy() for b in make_dataset(config).take(5)]
    other = [b["input_ids"].numpy() for b in make_dataset(PipelineConfig(**{**config.__dict__, "seed": 1})).take(5)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_input_pipelines_share_the_files_without_overlap(configs):
    config = PipelineConfig(**{**configs["padded"].__dict__, "is_training": False, "batch_size": 2})
    shares = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        shares.append(sequences([{k: v.numpy() for k, v in b.items()} for b in make_dataset(config, context)]))
    assert shares[0] and shares[1] and not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == sequences(one_epoch(configs["padded"]))


def test_a_checkpointed_iterator_resumes_without_repeating_or_skipping(configs, tmp_path):
    config = PipelineConfig(**{**configs["packed"].__dict__, "deterministic": True, "shuffle_buffer": 50})
    iterator = iter(make_dataset(config))
    for _ in range(3):
        next(iterator)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "input"))
    expected = [next(iterator)["input_ids"].numpy() for _ in range(4)]
    resumed = iter(make_dataset(config))
    tf.train.Checkpoint(iterator=resumed).restore(path)
    assert all(np.array_equal(next(resumed)["input_ids"].numpy(), e) for e in expected)


def test_a_corrupt_file_is_named_after_tf_data_fails(configs, tmp_path):
    source = configs["padded"].files[0]
    broken = tmp_path / "broken.tfrecord"
    data = open(source, "rb").read()
    broken.write_bytes(data[:500] + bytes([data[500] ^ 0xFF]) + data[501:])
    config = PipelineConfig(**{**configs["padded"].__dict__, "files": (str(broken),), "is_training": False})
    with pytest.raises(tf.errors.DataLossError):
        list(make_dataset(config))
    with pytest.raises(CorruptRecordError, match=rf"{broken}: record 0: data checksum mismatch"):
        diagnose_input_error(config)


def test_a_file_changed_under_a_running_pipeline_stops_it_when_opened_again(configs, tmp_path):
    copies = []
    for path in configs["padded"].files:
        copies.append(str(tmp_path / path.rsplit("/", 1)[1]))
        with open(copies[-1], "wb") as f:
            f.write(open(path, "rb").read())
    identity = tuple(FileIdentity.of(path) for path in copies)
    config = PipelineConfig(**{**configs["padded"].__dict__, "files": tuple(copies), "identity": identity,
                               "shuffle_buffer": 4, "cycle_length": 1})
    with open(copies[-1], "wb") as f:  # made again in place: records as good, others
        f.write(open(copies[0], "rb").read())
    with pytest.raises(DataChangedError, match=rf"{copies[-1]}: changed since the run started"):
        make_dataset(PipelineConfig(**{**config.__dict__, "is_training": False}))  # an evaluation, before reading


def test_a_file_changed_under_packing_on_the_fly_stops_the_stream_at_its_next_epoch(unpacked_dir, tmp_path):
    from bert_packed.inputs.file_identity import check_unchanged
    from bert_packed.packing import plan
    from bert_packed.packing.stream import StreamSettings, length_histogram, packed_batches

    path = str(tmp_path / "one.tfrecord")
    with open(path, "wb") as f:
        f.write(open(tfrecords(unpacked_dir)[0], "rb").read())
    identity = FileIdentity.of(path)
    strategies = plan(length_histogram([path], UNPACKED), MAX_SEQ_LENGTH, "lp", MAX_SEQUENCES_PER_PACK).strategies
    settings = StreamSettings(PACKED, strategies, 64, batch_size=4, shuffle_buffer=8)
    opened = []
    stream = packed_batches([path], settings, lambda p: (opened.append(p), check_unchanged([identity], "then")))
    next(stream)
    assert opened == [path]
    with open(path, "r+b") as f:  # the same size, its first bytes others
        f.write(b"\xff")
    with pytest.raises(DataChangedError, match=rf"{path}: changed since then \(its first 64 KiB are others\)"):
        for _ in range(200):
            next(stream)
    assert opened == [path, path]


def test_only_errors_of_the_input_are_taken_for_bad_data(configs, monkeypatch):
    from bert_packed.training import input_pipeline

    scanned = []
    monkeypatch.setattr(input_pipeline, "diagnose_input_error", scanned.append)
    model = tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [2,3] vs. [2,4]\n\t [[{{node add}}]]")
    with pytest.raises(tf.errors.InvalidArgumentError, match="Incompatible shapes"):  # a bug: as it is, no scan
        with reading_errors_named(configs["padded"]):
            raise model
    assert scanned == []
    reading = tf.errors.InvalidArgumentError(None, None, "Key: input_ids.  Can't parse serialized Example.\n\t "
                                                         "[[{{node IteratorGetNext}}]]")
    with pytest.raises(TrainingError, match=r"reading .*part-00000-000.tfrecord.*: Key: input_ids.  Can't parse"):
        with reading_errors_named(configs["padded"]):
            raise reading
    assert scanned == [configs["padded"]]


def test_unknown_mode_is_refused(configs):
    with pytest.raises(ValueError, match="unknown input mode 'mixed'"):
        make_dataset(PipelineConfig(**{**configs["padded"].__dict__, "mode": "mixed"}))


def test_too_few_files_for_the_input_pipelines_names_the_flag_that_writes_more(packed_dir):
    from bert_packed.errors import SettingsError

    shapes = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)
    one_file = (tfrecords(packed_dir)[0],)
    context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=0, num_replicas_in_sync=3)
    for mode in ("packed", "packed_online"):
        with pytest.raises(SettingsError, match=r"^1 training files cannot be shared among 3 input pipelines \(one a "
                                                r"worker\): .* \(pack_pretraining_data --num_shards=3\), or give "
                                                r"create_pretraining_data at least 3 text files$"):
            make_dataset(PipelineConfig(one_file, shapes, mode, batch_size=3, is_training=True,
                                        strategies=((1,),) if mode == "packed_online" else None,
                                        online_packing_window=8 if mode == "packed_online" else None), context)
