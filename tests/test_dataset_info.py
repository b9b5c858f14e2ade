"""metadata.json: one layout for unpacked and packed data."""

import json
import os
import shutil

import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, MAX_SEQUENCES_PER_PACK, TINY, inputs_of, run_command, tfrecords

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.inputs.dataset_info import (
    DataFile,
    DatasetInfo,
    DatasetInfoError,
    metadata_path,
    read_dataset_info,
    write_dataset_info,
)
from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset

PACKED = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)


def test_both_kinds_share_one_layout(unpacked_dir, packed_dir):
    unpacked, packed = read_dataset_info(unpacked_dir), read_dataset_info(packed_dir)
    common = ("format_version", "packed", "max_seq_length", "max_predictions_per_seq", "max_sequences_per_pack",
              "num_sequences", "num_records", "packing_factor", "checksum", "files", "eval_files", "sources")
    for directory, info in ((unpacked_dir, unpacked), (packed_dir, packed)):
        metadata = json.load(open(metadata_path(directory)))
        assert list(metadata)[:len(common)] == list(common), directory
        assert DatasetInfo.from_dict(metadata) == info
    assert (unpacked.packed, packed.packed) == (False, True)
    assert unpacked.shapes == Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS) and packed.shapes == PACKED
    assert unpacked.num_sequences == unpacked.num_records == packed.num_sequences == 122
    assert packed.num_records < 122 and packed.packing_factor == pytest.approx(122 / packed.num_records)
    assert unpacked.packing_factor == 1.0 and unpacked.checksum is None and len(packed.checksum) == 16


@pytest.mark.parametrize("content, message", [
    ("{not json", r"cannot read it as a dataset.s description \(not JSON: Expecting"),
    ("[1, 2]", r"\(not a JSON object\)"),
    ('{"format_version": 99}', "format_version 99; expected 3"),
    ('{"format_version": 3, "packed": true}', "missing or malformed entry 'max_seq_length'"),
])
def test_an_unreadable_description_is_named(tmp_path, content, message):
    (tmp_path / "metadata.json").write_text(content)
    with pytest.raises(DatasetInfoError, match=rf"{tmp_path}/metadata.json: .*{message}"):
        read_dataset_info(str(tmp_path))


def test_an_edited_vocabulary_size_is_named_and_a_recorded_one_read(unpacked_dir, tmp_path):
    metadata = json.load(open(metadata_path(unpacked_dir)))
    assert read_dataset_info(unpacked_dir).vocab_size == metadata["vocab_size"] == TINY["vocab_size"]
    for edited in ("30522", 0, True, 2.5):
        (tmp_path / "metadata.json").write_text(json.dumps({**metadata, "vocab_size": edited}))
        with pytest.raises(DatasetInfoError, match=rf"^{tmp_path}/metadata.json: vocab_size={edited!r}: expected the "
                                                   r"vocabulary's size, a whole number of 1 or more$"):
            read_dataset_info(str(tmp_path))
    del metadata["vocab_size"]  # not recorded (the reference's data): nothing to check the BERT config against
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))
    assert read_dataset_info(str(tmp_path)).vocab_size is None


def test_write_is_atomic_and_round_trips(tmp_path):
    info = DatasetInfo(True, Shapes(16, 4, 2), num_sequences=10, num_records=6, files=(DataFile("a.tfrecord"),),
                       checksum="00ff", details={"algorithm": "lpfhp", "num_packs": 999})
    written = write_dataset_info(str(tmp_path), info)
    assert os.listdir(tmp_path) == ["metadata.json"]
    assert written["num_packs"] == 6  # the owner's value wins over a producer's key of the same name
    assert read_dataset_info(str(tmp_path)) == DatasetInfo(True, Shapes(16, 4, 2), 10, 6, (DataFile("a.tfrecord"),),
                                                           checksum="00ff", details={"algorithm": "lpfhp"})
    assert read_dataset_info(str(tmp_path / "missing")) is None


@pytest.mark.slow  # packs and trains a run (over 3.5 s here)
def test_a_packed_eval_set_of_one_sequence_per_pack_is_read_as_packed(unpacked_dir, packed_dir, bert_config_file,
                                                                       tmp_path):
    """Depth 1 does not make packed data unpacked: the eval set is parsed with the packed keys."""
    eval_dir = tmp_path / "eval_packed_1"
    # A shard as the reference's files come, with no description of the text it was made from: a
    # shard of the training data's own dataset would be refused as trained-on text.
    (tmp_path / "bare").mkdir()
    bare = shutil.copy(tfrecords(unpacked_dir)[0], tmp_path / "bare")
    pack_pretraining_dataset(inputs_of([str(bare)]), str(eval_dir),
                             PackSettings(Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, 1), "lpfhp"), num_workers=1)
    assert read_dataset_info(str(eval_dir)).packed and read_dataset_info(str(eval_dir)).packing_factor == 1.0
    out = tmp_path / "run"
    result = run_command("run_pretraining", f"--bert_config_file={bert_config_file}",
                         f"--input_files={packed_dir}/packed-*.tfrecord", f"--eval_files={eval_dir}/packed-*.tfrecord",
                         f"--output_dir={out}", "--max_seq_length=128", "--max_predictions_per_seq=20",
                         "--train_batch_size=4", "--num_train_steps=1", "--eval_every_samples=0")
    assert result.returncode == 0, result.stderr[-3000:]
    [evaluation] = [json.loads(line) for line in open(out / "eval_log.jsonl")]
    assert evaluation["num_sequences"] == read_dataset_info(str(eval_dir)).num_sequences


def test_every_command_refuses_a_directory_of_another_kind(unpacked_dir, packed_dir, tmp_path):
    from bert_packed.errors import OutputDirectoryError
    from bert_packed.pretraining_data.create_dataset import create_pretraining_dataset

    unpacked, packed, run = tmp_path / "unpacked", tmp_path / "packed", tmp_path / "run"
    shutil.copytree(unpacked_dir, unpacked)
    shutil.copytree(packed_dir, packed)
    run.mkdir()
    (run / "train_log.jsonl").write_text('{"step": 1}\n')
    settings = PackSettings(PACKED, "lp", num_shards=2)
    with pytest.raises(OutputDirectoryError, match=rf"{unpacked}: holds unpacked data; packed data would be mixed"):
        pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(unpacked), settings, num_workers=1)
    with pytest.raises(OutputDirectoryError, match=rf"{run}: holds a training run; packed data would be mixed"):
        pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(run), settings, num_workers=1)
    from conftest import dataset_settings, write_corpus

    corpus = write_corpus(str(tmp_path), num_files=1)
    with pytest.raises(OutputDirectoryError, match=rf"{run}: holds a training run; unpacked data would be mixed"):
        create_pretraining_dataset(corpus, str(run), dataset_settings(), num_workers=1)
    assert sorted(os.listdir(unpacked)) == sorted(os.listdir(unpacked_dir))
    assert sorted(os.listdir(packed)) == sorted(os.listdir(packed_dir))
    from training_runs import config, make_trainer, trained

    with pytest.raises(OutputDirectoryError, match=rf"{packed}: holds packed data; a training run would be mixed"):
        trained(config(packed, tfrecords(packed_dir)))
    assert not (packed / "train_log.jsonl").exists() and not (packed / "run.json").exists()
    export = tmp_path / "export"  # an exported model (export_model's) is known by its weights
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"")
    with pytest.raises(OutputDirectoryError, match=rf"{export}: holds an exported model; a training run would be"):
        trained(config(export, tfrecords(packed_dir)))
    evaluated = config(export, tfrecords(packed_dir), eval_files=tuple(tfrecords(packed_dir)), eval_packed=True)
    with pytest.raises(OutputDirectoryError, match=rf"{export}: holds an exported model; a training run would be"):
        make_trainer(evaluated).evaluate_only()  # its eval_results.txt
    assert os.listdir(export) == ["model.safetensors"]


def test_files_of_two_kinds_are_refused_naming_both_before_a_command_s_own_check(packed_dir, unpacked_dir):
    # Described, before the settings are checked against the data: that advice ("use
    # --input_mode=packed") would fit one of them only.
    with pytest.raises(SettingsError, match=rf"^--input_file: the files mix datasets of other kinds or shapes: "
                                            rf"{unpacked_dir} holds unpacked data of L={MAX_SEQ_LENGTH}, "
                                            rf"P={MAX_PREDICTIONS}, {packed_dir} packed data of L={MAX_SEQ_LENGTH}, "
                                            rf"P={MAX_PREDICTIONS}, S={MAX_SEQUENCES_PER_PACK}; give one kind$"):
        Dataset.described([tfrecords(unpacked_dir)[0], tfrecords(packed_dir)[0]], "--input_file")
