"""Data is what it claims to be: datasets pinned by content, runs by their data, every value
checked before work, and one line for every problem."""

import dataclasses
import json
import os
import re
import shutil

import pytest
from conftest import (
    MAX_PREDICTIONS,
    MAX_SEQ_LENGTH,
    MAX_SEQUENCES_PER_PACK,
    TINY,
    dataset_settings,
    inputs_of,
    tfrecords,
    write_other_text,
)

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.inputs.dataset_info import DatasetFilesError, DatasetInfoError, metadata_path, read_dataset_info
from bert_packed.inputs.file_identity import FileIdentity
from bert_packed.inputs.histogram_file import load_histogram, save_histogram
from bert_packed.packing import pack_dataset
from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset
from bert_packed.packing.verify import verify_packed_dataset
from bert_packed.pretraining_data.create_dataset import create_pretraining_dataset
from bert_packed.records import read_record_batches
from bert_packed.storage.output_job import InputsChangedError

SETTINGS = PackSettings(Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK), "lp", num_shards=2)


@pytest.fixture
def unpacked_copy(unpacked_dir, tmp_path):
    copy = tmp_path / "unpacked"
    shutil.copytree(unpacked_dir, copy)
    return copy


@pytest.fixture
def packed_copy(packed_dir, tmp_path):
    copy = tmp_path / "packed"
    shutil.copytree(packed_dir, copy)
    return copy


def test_metadata_lists_each_file_with_what_identifies_it(unpacked_dir, packed_dir):
    for directory in (unpacked_dir, packed_dir):
        info = read_dataset_info(directory)
        assert sum(f.sequences for f in info.files) == info.num_sequences == 122
        assert sum(f.records for f in info.files) == info.num_records
        for entry in info.files:
            path = os.path.join(directory, entry.name)
            assert entry.bytes == os.path.getsize(path) and len(entry.head) == 64
    assert all(len(f.checksum) == 16 for f in read_dataset_info(packed_dir).files)
    held_out = read_dataset_info(unpacked_dir).eval_files
    assert held_out == () or all(f.name.startswith("eval-") for f in held_out)


def test_a_pack_stopped_then_fed_another_shard_ends(unpacked_copy, corpus, tmp_path, monkeypatch):
    """The packer hung forever: stopped after its first pass, an input replaced by a shard made
    with another seed, the same command looped in keyed_permutation. Now it packs what the
    inputs hold. (The files without their metadata.json, as the reference's come: with it, the
    replaced shard is refused before any work.)"""
    os.remove(metadata_path(str(unpacked_copy)))
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(pack_dataset, "_distribute", lambda *args: (_ for _ in ()).throw(OSError(28, "No space")))
        with pytest.raises(OSError):
            pack_pretraining_dataset(inputs_of(tfrecords(str(unpacked_copy))), str(out), SETTINGS, num_workers=1)
    assert (out / ".work" / "input-00000.json").exists()
    other = tmp_path / "other"
    create_pretraining_dataset(corpus, str(other), dataset_settings(seed=7), num_workers=1)
    shutil.copy(tfrecords(str(other))[0], tfrecords(str(unpacked_copy))[0])
    metadata = pack_pretraining_dataset(inputs_of(tfrecords(str(unpacked_copy))), str(out), SETTINGS, num_workers=1)
    held = sum(len(lengths) for path in tfrecords(str(unpacked_copy)) for *_, lengths in read_record_batches(path))
    assert metadata["num_sequences"] == verify_packed_dataset(str(out))["num_sequences"] == held != 122


def test_an_input_that_changes_between_the_packer_s_two_readings_is_one_line_and_the_rerun_packs_it(
        unpacked_copy, tmp_path, monkeypatch):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(pack_dataset, "_distribute", lambda *args: (_ for _ in ()).throw(OSError(28, "No space")))
        with pytest.raises(OSError):
            pack_pretraining_dataset(inputs_of(tfrecords(str(unpacked_copy))), str(out), SETTINGS, num_workers=1)
    first = out / ".work" / "input-00000.json"
    summary = json.loads(first.read_text())
    length = max(i for i, count in enumerate(summary["histogram"]) if count)
    summary["histogram"][length] -= 1  # the first reading saw one sequence of this length fewer...
    summary["checksum"] = "0" * 16  # ...and other content
    first.write_text(json.dumps(summary))
    with pytest.raises(InputsChangedError, match=r"part-00000-000.tfrecord: changed while its output was being made"):
        pack_pretraining_dataset(inputs_of(tfrecords(str(unpacked_copy))), str(out), SETTINGS, num_workers=1)
    pack_pretraining_dataset(inputs_of(tfrecords(str(unpacked_copy))), str(out), SETTINGS, num_workers=1)
    assert verify_packed_dataset(str(out))["num_sequences"] == 122


def test_a_finished_packing_s_rerun_reads_only_what_it_must(unpacked_copy, packed_dir, tmp_path, caplog):
    """A finished output's rerun opens no input against the disk (a shard of the input dataset
    it did not pack, deleted since, is not its concern), nor the inputs' histogram.json or their
    sources' metadata.json, which the packer never uses."""
    parts = tfrecords(str(unpacked_copy))
    out = str(tmp_path / "out")
    pack_pretraining_dataset(inputs_of(parts[:1]), out, SETTINGS, num_workers=1)
    os.remove(parts[-1])
    save_histogram(str(unpacked_copy / "histogram.json"), [1])  # another dataset's
    caplog.clear()
    assert pack_pretraining_dataset(inputs_of(parts[:1]), out, SETTINGS, num_workers=1)["num_sequences"] == \
        read_dataset_info(str(unpacked_copy)).files[0].sequences
    assert "histogram" not in caplog.text
    packed = tmp_path / "packed"  # packs whose sources are out of reach: refused as packs, not by the reach
    shutil.copytree(packed_dir, packed)
    metadata = json.loads(open(metadata_path(str(packed))).read())
    metadata["sources"] = [f"s3://nowhere/{os.path.basename(path)}" for path in metadata["sources"]]
    open(metadata_path(str(packed)), "w").write(json.dumps(metadata))
    with pytest.raises(DatasetFilesError, match=r"packed/metadata.json describes packed data; the packer reads"):
        pack_pretraining_dataset(inputs_of(tfrecords(str(packed))), str(tmp_path / "again"), SETTINGS, num_workers=1)


def test_packed_output_of_regenerated_inputs_is_made_again(unpacked_copy, corpus, tmp_path, caplog):
    out = tmp_path / "out"
    pack_pretraining_dataset(inputs_of(tfrecords(str(unpacked_copy))), str(out), SETTINGS, num_workers=1)
    before = read_dataset_info(str(out))
    regenerated = tmp_path / "regenerated"
    create_pretraining_dataset(corpus, str(regenerated), dataset_settings(seed=7), num_workers=1)
    for path in tfrecords(str(unpacked_copy)):
        os.remove(path)
    for path in tfrecords(str(regenerated)) + [metadata_path(str(regenerated))]:
        shutil.copy(path, unpacked_copy)
    again = pack_pretraining_dataset(inputs_of(tfrecords(str(unpacked_copy))), str(out), SETTINGS, num_workers=1)
    assert "the input files changed since its packed data was made; making it again" in caplog.text
    expected = sum(read_dataset_info(str(regenerated)).files[i].sequences
                   for i in range(len(read_dataset_info(str(regenerated)).files)))
    assert again["num_sequences"] == expected != before.num_sequences
    assert verify_packed_dataset(str(out))["num_sequences"] == expected


def test_a_finished_dataset_on_read_only_storage_packs_as_nothing_to_do_and_verifies(packed_dir, unpacked_dir,
                                                                                    corpus, monkeypatch):
    def refused(*args, **kwargs):
        raise OSError(30, "Read-only file system", str(args[0]) if args else "")

    from bert_packed.storage import files, locks

    monkeypatch.setattr(locks, "exclusive", refused)
    monkeypatch.setattr(files, "makedirs", refused)
    monkeypatch.setattr(files, "write_text_atomically", refused)
    again = pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), packed_dir, SETTINGS, num_workers=1)
    assert again["num_sequences"] == 122
    # The records it was packed from, made again with the same command: nothing to do either.
    assert create_pretraining_dataset(corpus, unpacked_dir, dataset_settings(), num_workers=1)["num_sequences"] == 122
    assert verify_packed_dataset(packed_dir)["num_sequences"] == 122


@pytest.mark.parametrize("damage, error, message", [
    ("delete", DatasetFilesError, r"packed-00001-of-00002.tfrecord: listed in metadata.json but missing"),
    ("cut", DatasetFilesError, r"packed-00001-of-00002.tfrecord: not the file metadata.json describes "
              r"\([\d,]+ bytes, was [\d,]+\): cut short"),
    ("foreign", DatasetFilesError, r"packed-00001-of-00002.tfrecord: not the file metadata.json describes "
                r"\((.* bytes, was|its first 64 KiB)"),
    ("extra", DatasetFilesError, r"stray.tfrecord is not a file of the dataset"),
    ("sequences x 10", DatasetInfoError, r"cannot be \(a packing factor of [\d.]+ at depth 3\)"),
    ("no sequences", DatasetInfoError, r"0 sequences in \d+ records"),
    ("counts that do not add up", DatasetInfoError, r"its files hold 122 sequences together, but num_sequences is 123"),
    ("a count as a string", DatasetInfoError, r"metadata.json: the entry of 'packed-00001-of-00002.tfrecord': records "
                                              r"is '\d+', expected a count"),
])
def test_training_data_is_checked_against_its_metadata_before_any_work(packed_copy, unpacked_dir, tmp_path, damage,
                                                                       error, message):

    shard = packed_copy / "packed-00001-of-00002.tfrecord"
    metadata = json.loads(open(metadata_path(str(packed_copy))).read())
    if damage == "delete":
        shard.unlink()
    elif damage == "cut":  # at a record boundary: the first record only
        _, _, starts, lengths = next(read_record_batches(str(shard)))
        shard.write_bytes(shard.read_bytes()[:16 + int(lengths[0])])
    elif damage == "foreign":
        shutil.copy(tfrecords(unpacked_dir)[0], shard)
    elif damage == "extra":
        shutil.copy(shard, packed_copy / "stray.tfrecord")
    elif damage == "sequences x 10":
        metadata["num_sequences"] *= 10
        for entry in metadata["files"]:
            entry["sequences"] *= 10
    elif damage == "no sequences":
        metadata["num_sequences"] = 0
    elif damage == "a count as a string":  # an internal error (int + str) in the eval path
        metadata["files"][1]["records"] = str(metadata["files"][1]["records"])
    else:
        metadata["num_sequences"] += 1
    open(metadata_path(str(packed_copy)), "w").write(json.dumps(metadata))
    shapes = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)
    with pytest.raises(error, match=message):
        training_data(tfrecords(str(packed_copy)), shapes, "packed")
    if damage in ("delete", "cut", "foreign"):
        with pytest.raises(error, match=message):
            verify_packed_dataset(str(packed_copy))  # one line, no traceback, at the command line


def test_a_side_histogram_that_is_not_the_dataset_s_is_recounted_with_one_line(unpacked_copy, packed_dir, caplog):

    shapes = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)
    paths = tfrecords(str(unpacked_copy))
    own = load_histogram(str(unpacked_copy / "histogram.json"))
    info = read_dataset_info(str(unpacked_copy))
    assert len(info.histogram_sha256) == 64 and len(read_dataset_info(packed_dir).histogram_sha256) == 64
    assert Dataset.open(paths, "--input_file").histogram.tolist() == own.tolist()
    foreign = own.copy()
    foreign[:] = 0
    foreign[-1] = 1  # another dataset's: one full-length sequence (a packing factor of 1.0, train_samples 1)
    side = unpacked_copy / "histogram.json"
    edits = [
        (lambda: (side.unlink(), side.mkdir()), r"histogram.json: not a regular file; counting the lengths again"),
        (lambda: (side.rmdir(), os.mkfifo(side)), r"histogram.json: not a regular file"),  # read, it would block
        (lambda: side.unlink(), r"histogram.json: missing, though metadata.json records it; counting the lengths"),
        (lambda: save_histogram(str(unpacked_copy / "histogram.json"), foreign),
         r"histogram.json: not the histogram metadata.json recorded \(edited, or another dataset's\)"),
        (lambda: _unpin(unpacked_copy), r"histogram.json: counts 1 sequences, metadata.json 122"),
        (lambda: (unpacked_copy / "histogram.json").write_text("[1, 2"),
         r"histogram.json: not valid JSON: .*; counting the lengths again"),
    ]
    for edit, line in edits:
        edit()
        caplog.clear()
        assert Dataset.open(paths, "--input_file").histogram is None
        assert any(re.search(line, r.getMessage()) for r in caplog.records), [r.getMessage() for r in caplog.records]
        counted = training_data(paths, shapes, "packed_online")
        assert counted.histogram == tuple(own.tolist()) and counted.num_sequences == 122
        assert counted.packing_factor > 1.2  # the foreign histogram gives 1.0


def _unpin(directory) -> None:
    metadata = json.loads(open(metadata_path(str(directory))).read())
    metadata["histogram_sha256"] = None
    open(metadata_path(str(directory)), "w").write(json.dumps(metadata))


def test_the_packer_compares_its_inputs_with_their_metadata(unpacked_copy, packed_dir, tmp_path):
    paths = tfrecords(str(unpacked_copy))
    metadata = json.loads(open(metadata_path(str(unpacked_copy))).read())
    for entry in metadata["files"][:1]:
        entry["sequences"] += 1
        entry["records"] += 1
    metadata["num_sequences"] += 1
    metadata["num_records"] += 1
    metadata["num_instances"] += 1
    open(metadata_path(str(unpacked_copy)), "w").write(json.dumps(metadata))
    with pytest.raises(DatasetFilesError, match=rf"{paths[0]}: holds (\d+) sequences, but its metadata.json counts "
                                                rf"(\d+): the file or the description was changed"):
        pack_pretraining_dataset(inputs_of(paths), str(tmp_path / "a"), SETTINGS, num_workers=1)
    shutil.copy(paths[1], paths[0])  # a shard replaced by another
    with pytest.raises(DatasetFilesError,
                       match=rf"{paths[0]}: not the file metadata.json describes \((.* bytes, was|its first 64 KiB)"):
        pack_pretraining_dataset(inputs_of(paths), str(tmp_path / "b"), SETTINGS, num_workers=1)
    with pytest.raises(DatasetFilesError, match=r"packed0/metadata.json describes packed data; the packer reads "
                                                r"unpacked records"):
        pack_pretraining_dataset(inputs_of(tfrecords(packed_dir)), str(tmp_path / "c"), SETTINGS, num_workers=1)
    wrong = PackSettings(Shapes(64, MAX_PREDICTIONS, 3))
    with pytest.raises(SettingsError, match=r"unpacked/metadata.json says max_seq_length=128, but --max_seq_length=64"):
        pack_pretraining_dataset(inputs_of(paths), str(tmp_path / "d"), wrong, num_workers=1)
    assert not os.path.exists(tmp_path / "b" / ".work") and not os.path.exists(tmp_path / "d" / ".work")


def test_eval_files_are_counted_against_their_metadata_before_training(unpacked_copy, packed_copy):
    """Counts moved between two files (the totals kept) were caught by the first evaluation, after
    training, and reported as a bug."""

    for directory, shapes in ((unpacked_copy, Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS)),
                              (packed_copy, Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK))):
        paths = tfrecords(str(directory))
        counted = evaluation_data(paths, shapes, "padded")
        metadata = json.loads(open(metadata_path(str(directory))).read())
        assert counted.num_sequences == metadata["num_sequences"] == sum(f["sequences"] for f in metadata["files"])
        first = metadata["files"][0]["sequences"]
        metadata["files"][0]["sequences"] += 1
        metadata["files"][1]["sequences"] -= 1
        open(metadata_path(str(directory)), "w").write(json.dumps(metadata))
        with pytest.raises(DatasetFilesError, match=rf"^{paths[0]}: holds {first} sequences, but its metadata.json "
                                                    rf"counts {first + 1}: the file or the description was changed"):
            evaluation_data(paths, shapes, "padded")


def test_eval_records_are_never_trained_on_whatever_way_they_take(corpus, unpacked_dir, packed_dir, tmp_path):
    from bert_packed.inputs.provenance import origins, require_apart

    split = tmp_path / "split"  # the corpus under another seed, 30% held out
    create_pretraining_dataset(corpus, str(split), dataclasses.replace(dataset_settings(seed=7), eval_fraction=0.3),
                               num_workers=1)
    assert len(read_dataset_info(unpacked_dir).details["source_sha256"]) == len(corpus)
    held_out = sorted(str(p) for p in split.glob("eval-*.tfrecord"))
    parts = sorted(str(p) for p in split.glob("part-*.tfrecord"))
    assert len(held_out) == 2 and len(parts) == 4
    packed_parts = tmp_path / "packed_parts"
    pack_pretraining_dataset(inputs_of(parts), str(packed_parts), SETTINGS, num_workers=1)
    copy = tmp_path / "copy"  # the same run's files elsewhere: the same split
    shutil.copytree(split, copy)
    for train in (parts, tfrecords(str(packed_parts)), [p for p in parts if "-000." in p]):
        require_apart(origins(train), origins(held_out), "--eval_files")  # its own held-out documents, packed or not
        require_apart(origins(train), origins(sorted(str(p) for p in copy.glob("eval-*.tfrecord"))), "--eval_files")
    text = write_other_text(corpus[0], tmp_path / "other.txt")
    create_pretraining_dataset([str(text)], str(tmp_path / "other"), dataset_settings(), num_workers=1)
    require_apart(origins(tfrecords(unpacked_dir)), origins(tfrecords(str(tmp_path / "other"))), "--eval_files")

    another_split = (rf"^--eval_files: {held_out[0]} holds documents held out from {split}, but the training data "
                     rf"\(\S+\) was made from the same text by another run \(another seed or split\)")
    for train in (tfrecords(unpacked_dir), tfrecords(packed_dir), parts + tfrecords(unpacked_dir)):
        with pytest.raises(SettingsError, match=another_split):
            require_apart(origins(train), origins(held_out), "--eval_files")
    # Another dupe pass of the same documents, masked again: in the same directory too.
    with pytest.raises(SettingsError, match=rf"{parts[1]} holds training records \({parts[1]}\) of a text file the "
                                            rf"training data \({parts[0]}\) was made from too"):
        require_apart(origins(parts[:1]), origins(parts[1:2]), "--eval_files")
    with pytest.raises(SettingsError, match=rf"{parts[0]} holds the records of {parts[0]}, which the training data "
                                            rf"holds too \({packed_parts}/\S+\)"):
        require_apart(origins(tfrecords(str(packed_parts))), origins(parts[:1]), "--eval_files")

    # The held-out documents packed: not training data, unless the user says so; never beside the eval set.
    packed_held_out = tmp_path / "packed_held_out"
    pack_pretraining_dataset(inputs_of(held_out), str(packed_held_out), SETTINGS, num_workers=1)
    with pytest.raises(DatasetFilesError, match=rf"--input_file: {packed_held_out}/\S+ was packed from held-out "
                                                rf"evaluation documents \({held_out[0]}\)"):
        Dataset.open(tfrecords(str(packed_held_out)), "--input_file", training=True)
    Dataset.open(tfrecords(str(packed_held_out)), "--input_file", training=True, held_out_allowed=True)
    with pytest.raises(SettingsError, match=rf"{held_out[0]} holds the records of {held_out[0]}, which the training "
                                            rf"data holds too"):
        require_apart(origins(tfrecords(str(packed_held_out))), origins(held_out), "--eval_files")
    with pytest.raises(DatasetFilesError, match=rf"--input_files: {held_out[0]} is a held-out file and {parts[0]} a "
                                                rf"training shard: give one set or the other"):
        pack_pretraining_dataset(inputs_of(held_out + parts), str(tmp_path / "mixed"), SETTINGS, num_workers=1)


def test_run_pretraining_checks_its_settings_before_the_disk_and_reads_only_the_files_it_uses(
        unpacked_copy, packed_dir, corpus, bert_config_file, tmp_path):
    """The settings are checked against what metadata.json says before a file is read; an
    evaluation alone reads --input_file not at all when --eval_files names the eval set, and takes
    L and P from it; the training files evaluated with --do_eval alone are an eval set there."""
    from bert_packed.training.assemble import assemble
    from bert_packed.training.pretraining import PretrainingSettings

    parts = tfrecords(str(unpacked_copy))
    os.remove(parts[-1])  # a shard deleted: the dataset is incomplete
    common = dict(bert_config_file=bert_config_file, output_dir=str(tmp_path / "run"),
                  input_file=str(unpacked_copy / "part-*.tfrecord"))
    with pytest.raises(SettingsError, match=r"--max_seq_length=256 .*max_position_embeddings=128"):
        assemble(PretrainingSettings.of(**common, max_seq_length=256))
    with pytest.raises(DatasetFilesError, match=r"listed in metadata.json but missing"):
        assemble(PretrainingSettings.of(**common))
    evaluation = f"{packed_dir}/packed-*.tfrecord"
    _, train, evaluated = assemble(PretrainingSettings.of(**common, do_train=False, do_eval=True,
                                                          eval_files=evaluation))
    assert train.files == () and evaluated.files == tuple(tfrecords(packed_dir)) and evaluated.input_mode == "packed"
    assert evaluated.shapes == Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)
    with pytest.raises(SettingsError, match=r"--eval_files: packed data \(metadata.json\), but --eval_input_mode=padded "
                                            r"reads unpacked records; use --eval_input_mode=packed"):
        assemble(PretrainingSettings.of(**common, do_train=False, do_eval=True, eval_files=evaluation,
                                        eval_input_mode="padded"))
    bare = tmp_path / "bare"  # the reference's eval set, no metadata.json: read at --input_file's L and P
    bare.mkdir()
    shutil.copy(parts[0], bare)
    _, _, evaluated = assemble(PretrainingSettings.of(**common, do_train=False, do_eval=True,
                                                      eval_files=str(bare / "*.tfrecord")))
    assert evaluated.shapes == Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS) and evaluated.input_mode == "padded"
    held_out = tmp_path / "held_out"  # training shards and held-out files, trained on as the user says
    create_pretraining_dataset(corpus, str(held_out),
                               dataclasses.replace(dataset_settings(), eval_fraction=0.3), num_workers=1)
    with pytest.raises(DatasetFilesError, match=r"is a held-out file and .* a training shard: give one set or the "
                                                r"other"):
        assemble(PretrainingSettings.of(**{**common, "input_file": str(held_out / "*.tfrecord")}, do_eval=True,
                                        train_on_held_out_files=True))


def test_held_out_files_never_train_unless_the_user_says_so(corpus, tmp_path):

    directory = tmp_path / "held_out"
    settings = dataclasses.replace(dataset_settings(), eval_fraction=0.3)
    create_pretraining_dataset(corpus, str(directory), settings, num_workers=1)
    info = read_dataset_info(str(directory))
    assert info.eval_files and all(f.name.startswith("eval-") and f.bytes for f in info.eval_files)
    everything = sorted(str(path) for path in directory.glob("*.tfrecord"))  # --input_files=DIR/*.tfrecord
    shapes = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS)
    with pytest.raises(DatasetFilesError, match=r"eval-00000.tfrecord holds the dataset's held-out evaluation "
                                                 r"documents; training reads .*part-\*.tfrecord"):
        training_data(everything, shapes, "padded")
    allowed = training_data(everything, shapes, "padded", held_out_allowed=True)
    assert allowed.num_sequences == info.num_sequences + sum(f.sequences for f in info.eval_files)
    parts = sorted(str(path) for path in directory.glob("part-*.tfrecord"))
    assert training_data(parts, shapes, "padded").num_sequences == info.num_sequences
    part = training_data(parts[:1], shapes, "padded")  # a subset: its own count
    assert part.num_sequences == info.files[0].sequences < info.num_sequences
    held_out = sorted(str(p) for p in directory.glob("eval-*.tfrecord"))
    evaluation = evaluation_data(held_out, shapes, "padded")
    assert evaluation.files and evaluation.input_mode == "padded"
    packed = tmp_path / "packed"  # packs of them: the same documents, the same rule
    pack_pretraining_dataset(inputs_of(held_out), str(packed), SETTINGS, num_workers=1)
    packed_shapes = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)
    with pytest.raises(DatasetFilesError, match=r"packed-\S+ was packed from held-out evaluation documents"):
        training_data(tfrecords(str(packed)), packed_shapes, "packed")
    allowed = training_data(tfrecords(str(packed)), packed_shapes, "packed", held_out_allowed=True)
    assert allowed.num_sequences == sum(f.sequences for f in info.eval_files)


@pytest.mark.slow  # trains, makes its data again and resumes (over 3.5 s here)
def test_a_run_refuses_to_resume_on_data_made_again_since_it_started(packed_copy, tmp_path):
    from training_runs import config, trained

    from bert_packed.storage.run_directory import RunError

    def run(steps, directory=packed_copy):
        inputs = Dataset.open(tfrecords(str(directory)), "--input_file", training=True)
        return trained(config(tmp_path / "run", tfrecords(str(directory)), num_train_steps=steps,
                              identity=inputs.identity))

    run(1)
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["train_files"]
    assert [entry[0] for entry in recorded] == tfrecords(str(packed_copy))
    moved = tmp_path / "moved"
    shutil.copytree(packed_copy, moved)
    run(2, moved)  # the same data, moved (known by content, not by path): it goes on
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["train_files"]
    assert [entry[0] for entry in recorded] == tfrecords(str(moved))
    shard = packed_copy / "packed-00000-of-00002.tfrecord"
    content = bytearray(shard.read_bytes())
    content[20] ^= 1  # made again, the same size: another first 64 KiB
    shard.write_bytes(bytes(content))
    metadata = json.loads(open(metadata_path(str(packed_copy))).read())
    metadata["files"][0]["head"] = FileIdentity.of(str(shard)).head
    open(metadata_path(str(packed_copy)), "w").write(json.dumps(metadata))
    before = (tmp_path / "run" / "train_log.jsonl").read_text()
    with pytest.raises(RunError, match=r"the train files changed since this run started \(.*packed-00000-of-00002"
                                       r".tfrecord holds other content.*\); resuming would go on with other data"):
        run(3)
    assert (tmp_path / "run" / "train_log.jsonl").read_text() == before  # refused: nothing touched


def test_data_made_again_is_named_before_the_settings_it_changes(tmp_path):
    """Data made again changes what follows from it (the packing factor of packing on the fly):
    the user gave the same flags, so the line names the data."""
    from bert_packed.storage.run_directory import RunDirectory, RunError

    run = RunDirectory(str(tmp_path))
    run.claim({"packing_factor": 1.9, "seed": 1}, {"train_files": [["/data/part-0.tfrecord", 100, "aa"]]})
    with pytest.raises(RunError, match=r"the train files changed since this run started \(part-0.tfrecord"):
        run.claim({"packing_factor": 2.1, "seed": 1}, {"train_files": [["/data/part-0.tfrecord", 120, "bb"]]})
    with pytest.raises(RunError, match=r"holds another run \(seed: 1 there, 2 here\)"):
        run.claim({"packing_factor": 1.9, "seed": 2}, {"train_files": [["/moved/part-0.tfrecord", 100, "aa"]]})
    # A run.json that records fewer settings (another version wrote it) cannot be told apart.
    (tmp_path / "other").mkdir()
    other = RunDirectory(str(tmp_path / "other"))
    other.claim({"seed": 1}, {"train_files": []})
    with pytest.raises(RunError, match=r"holds a run whose run.json records no packing_factor \(made by another "
                                       r"version of bert-packed\)"):
        other.claim({"packing_factor": 1.9, "seed": 1}, {"train_files": []})


@pytest.mark.parametrize("entries", [5, [None], [5], [["part-0.tfrecord", "100", "aa"]], [["part-0.tfrecord", 100]]])
def test_a_hand_edited_record_of_the_data_is_damaged_in_one_line(tmp_path, entries):
    """Damaged for a resume, which compares the record; any other reader of run.json (a plot, an
    export) reads the rest of it."""
    from bert_packed.storage.run_directory import RunDirectory, RunError

    run = RunDirectory(str(tmp_path))
    (tmp_path / "run.json").write_text(json.dumps({"seed": 1, "train_files": entries}))
    with pytest.raises(RunError, match=r"run.json: damaged, train_files (entry 0 )?is not (a list of )?\[path, bytes, "
                                       r"head\] \(found .*\); resuming cannot tell whether the data changed: use a "
                                       r"new --output_dir$"):
        run.claim({"seed": 1}, {"train_files": [["/data/part-0.tfrecord", 100, "aa"]]})
    assert run.read_info()["seed"] == 1


def test_the_refusal_says_what_differs_in_data_of_the_same_size_or_given_twice(tmp_path):
    from bert_packed.storage.run_directory import RunDirectory, RunError

    run = RunDirectory(str(tmp_path))
    first, second = ["/data/part-0.tfrecord", 100, "aa"], ["/data/part-1.tfrecord", 9, "cc"]
    run.claim({"seed": 1}, {"train_files": [first, second]})
    for now, why in (([[*first[:2], "bb"], second], "part-0.tfrecord holds other content: the same 100 bytes, but "
                                                    "their hash differs"),
                     ([first, second, second], "part-1.tfrecord is given 2 times, 1 before"),
                     ([second, first], "the order of the files")):
        with pytest.raises(RunError, match=re.escape(f"({why})")):
            run.claim({"seed": 1}, {"train_files": now})
    # Files of one name in two directories: paired in their order, not one taken for the other.
    (tmp_path / "two").mkdir()
    two = RunDirectory(str(tmp_path / "two"))
    wiki, books = ["/wiki/part-0.tfrecord", 100, "aa"], ["/books/part-0.tfrecord", 200, "bb"]
    two.claim({"seed": 1}, {"train_files": [wiki, books]})
    for now, why in (([[*wiki[:2], "zz"], books], "part-0.tfrecord holds other content: the same 100 bytes, but "
                                                  "their hash differs"),
                     ([wiki], "part-0.tfrecord is given 1 time, 2 before"),
                     ([books, wiki], "the order of the files")):
        with pytest.raises(RunError, match=re.escape(f"({why})")):
            two.claim({"seed": 1}, {"train_files": now})


def training_data(paths, shapes, input_mode, held_out_allowed=False):
    """The training data of `paths` as run_pretraining opens and checks them."""
    from bert_packed.training import data

    return data.train_data(Dataset.described(paths, "--input_file"), shapes, train_settings(input_mode),
                           held_out_allowed=held_out_allowed)


def evaluation_data(paths, shapes, input_mode):
    """The eval data of `paths` (--eval_files) as run_pretraining opens and checks them."""
    from bert_packed.training import data

    return data.eval_data(Dataset.described(paths, "--eval_files"), shapes, train_settings(input_mode))


def train_settings(input_mode):
    """The settings of a run of the tiny model reading its data in `input_mode`."""
    from bert_packed.model import BertConfig
    from bert_packed.training.config import make_config

    return make_config(bert=BertConfig(**TINY), output_dir="unused", input_mode=input_mode)


def test_a_run_directory_names_the_other_command_s_run(tmp_path):
    """run_squad onto a finished run_classifier directory named only what differed."""
    from bert_packed.storage.run_directory import RunDirectory, RunError

    (tmp_path / "run").mkdir()
    directory = RunDirectory(str(tmp_path / "run"))
    directory.claim({"task_name": "jsonl", "seed": 1}, {})
    with pytest.raises(RunError, match=r"run: holds a run_classifier run; this is run_squad's: use a new --output_dir"):
        directory.claim({"doc_stride": 128, "seed": 1}, {})
    with pytest.raises(RunError, match=r"holds a run_classifier run; this is run_pretraining's"):
        directory.claim({"seed": 1}, {})
    assert directory.claim({"task_name": "jsonl", "seed": 1}, {})["task_name"] == "jsonl"
