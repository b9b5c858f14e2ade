import json
import os
import shutil

import numpy as np
import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, MAX_SEQUENCES_PER_PACK, VOCAB_TOKENS, inputs_of, tfrecords

from bert_packed.errors import OutputDirectoryError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import DatasetFilesError, read_dataset_info
from bert_packed.inputs.file_identity import FileIdentity
from bert_packed.packing import pack_dataset as pack_module
from bert_packed.packing import packer
from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset
from bert_packed.packing.verify import VerifyError, verify_packed_dataset
from bert_packed.records import CorruptRecordError, RecordError, TFRecordWriter, read_packed, read_unpacked
from bert_packed.storage.output_job import InputsChangedError

PACKED = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)
UNPACKED = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS)
CLS = VOCAB_TOKENS.index("[CLS]")  # the test vocabulary's


def input_rows_of(path):
    return np.concatenate([packer.rows_from_unpacked(batch, UNPACKED, 0, first)
                           for first, batch in read_unpacked(path, UNPACKED)])


def input_rows(unpacked_dir):
    return np.concatenate([input_rows_of(path) for path in tfrecords(unpacked_dir)])


def packed_records(packed_dir):
    batches = [batch for path in tfrecords(packed_dir) for _, batch in read_packed(path, PACKED)]
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def content(rows):
    """Each sequence's content as a hashable tuple (provenance left out), as a sorted list."""
    fields = ("length", "num_predictions", "next_sentence_label", "input_ids", "segment_ids",
              "masked_lm_positions", "masked_lm_ids")
    return sorted(tuple(np.concatenate([np.atleast_1d(row[f]).astype(np.int64) for f in fields]).tolist())
                  for row in rows)


def random_rows(rng, count, shapes=UNPACKED):
    rows = np.zeros(count, dtype=packer.row_dtype(shapes))
    rows["length"] = rng.integers(2, shapes.max_seq_length // 3, count)
    rows["num_predictions"] = np.minimum(shapes.max_predictions_per_seq, np.maximum(1, rows["length"] // 7))
    rows["next_sentence_label"] = rng.integers(0, 2, count)
    for i, row in enumerate(rows):
        rows["input_ids"][i, :row["length"]] = rng.integers(1, 30000, row["length"])
        rows["segment_ids"][i, row["length"] // 2:row["length"]] = 1
        positions = np.sort(rng.choice(np.arange(1, row["length"]), row["num_predictions"], replace=False))
        rows["masked_lm_positions"][i, :row["num_predictions"]] = positions
        rows["masked_lm_ids"][i, :row["num_predictions"]] = rng.integers(1, 30000, row["num_predictions"])
    return rows


def test_assemble_then_unpack_gives_back_the_rows():
    rng = np.random.default_rng(0)
    rows = random_rows(rng, 60)
    pack_of_row = np.repeat(np.arange(20), 3)  # 3 short sequences a pack
    position = np.tile(np.arange(3), 20)
    order = rng.permutation(60)
    packs = packer.assemble_packs(rows[order], pack_of_row[order], position[order], 20, PACKED)
    assert content(packer.unpack(packs, UNPACKED)) == content(rows)
    assert packer.checksum(packer.unpack(packs, UNPACKED)) == packer.checksum(rows[order])


def test_checksum_is_order_independent_and_sensitive_to_content():
    rows = random_rows(np.random.default_rng(1), 10)
    assert packer.checksum(rows) == packer.checksum(rows[::-1])
    changed = rows.copy()
    changed["input_ids"][3, 0] += 1
    assert packer.checksum(changed) != packer.checksum(rows)
    moved = rows.copy()  # the same token moved from one sequence to another
    moved["masked_lm_ids"][0, 0], moved["masked_lm_ids"][1, 0] = rows["masked_lm_ids"][1, 0], rows["masked_lm_ids"][0, 0]
    assert packer.checksum(moved) != packer.checksum(rows)
    assert packer.checksum(np.concatenate([rows, rows[:1]])) != packer.checksum(rows)  # a duplicate shows


def test_assemble_refuses_overflowing_packs():
    rows = random_rows(np.random.default_rng(2), 2, Shapes(MAX_SEQ_LENGTH, 40))
    rows["num_predictions"] = 12  # 24 predictions in a pack of P' = 20 + 3
    rows["length"] = 40
    with pytest.raises(ValueError, match="pack 0 overflows.*23 predictions"):
        packer.assemble_packs(rows, np.array([0, 0]), np.array([0, 1]), 1, Shapes(MAX_SEQ_LENGTH, 40 - 20, 3))


@pytest.mark.parametrize("size", [1, 2, 3, 17, 1000, 65537])
def test_keyed_permutation_is_a_bijection(size):
    values = packer.keyed_permutation(np.arange(size), size, key=3)
    assert sorted(values.tolist()) == list(range(size))
    if size > 100:
        assert not np.array_equal(values, packer.keyed_permutation(np.arange(size), size, key=4))
        assert abs(np.corrcoef(np.arange(size), values)[0, 1]) < 0.1  # no visible order left


def test_the_data_commands_are_functions_of_their_settings_as_a_notebook_calls_them(corpus, tmp_path):
    """create_pretraining_data(CreateSettings(...)) then pack_pretraining_data(PackCommandSettings(...)),
    verified: each returns its metadata.json; the packs hold every sequence the records hold; a
    setting that cannot work is a SettingsError before anything is written."""
    from conftest import VOCAB

    from bert_packed.errors import SettingsError
    from bert_packed.packing.pack_dataset import pack_pretraining_data
    from bert_packed.packing.pack_settings import PackCommandSettings
    from bert_packed.pretraining_data.create_command import CreateSettings, create_pretraining_data

    unpacked, packed = str(tmp_path / "unpacked"), str(tmp_path / "packed")
    created = create_pretraining_data(CreateSettings(input_file=",".join(corpus), output_dir=unpacked, vocab_file=VOCAB,
                                                     max_seq_length=MAX_SEQ_LENGTH, max_predictions_per_seq=20,
                                                     dupe_factor=1, num_workers=1))
    assert created == json.load(open(os.path.join(unpacked, "metadata.json"))) and created["num_sequences"] > 50
    packs = pack_pretraining_data(PackCommandSettings(input_files=f"{unpacked}/part-*.tfrecord", output_dir=packed,
                                                      max_sequences_per_pack=3, num_workers=1, verify=True))
    assert packs == json.load(open(os.path.join(packed, "metadata.json")))
    assert packs["num_sequences"] == created["num_sequences"] and packs["num_records"] < created["num_sequences"]
    assert (packs["max_seq_length"], packs["max_predictions_per_seq"]) == (MAX_SEQ_LENGTH, 20)  # the records'
    with pytest.raises(SettingsError, match="give one of --output_dir"):
        CreateSettings(input_file=corpus[0])
    with pytest.raises(SettingsError, match="--max_sequences_per_pack=0: must be >= 1"):
        PackCommandSettings(input_files=f"{unpacked}/part-*.tfrecord", output_dir=packed, max_sequences_per_pack=0)


def test_packed_output_holds_exactly_the_input_sequences(unpacked_dir, packed_dir):
    assert content(packer.unpack(packed_records(packed_dir), UNPACKED)) == content(input_rows(unpacked_dir))
    metadata = read_dataset_info(packed_dir).to_dict()
    assert metadata["num_sequences"] == len(input_rows(unpacked_dir)) == 122
    assert metadata["checksum"] == f"{packer.checksum(input_rows(unpacked_dir)):016x}"
    assert verify_packed_dataset(packed_dir)["num_sequences"] == 122
    assert metadata["num_packs"] < 122 and metadata["efficiency"] > 0.9
    assert metadata["packing_factor"] == pytest.approx(122 / metadata["num_packs"])
    assert len(metadata["files"]) == 2 and not os.path.exists(os.path.join(packed_dir, ".work"))


def test_packed_layout_is_right_pack_by_pack(packed_dir):
    """Checked independently of packer.unpack: indices, positions and offsets in every pack."""
    records = packed_records(packed_dir)
    for r in range(len(records["input_ids"])):
        mask, positions = records["input_mask"][r], records["positions"][r]
        count = int(records["next_sentence_weights"][r].sum())
        assert 1 <= count <= MAX_SEQUENCES_PER_PACK and (records["next_sentence_weights"][r][:count] == 1).all()
        real = int((mask > 0).sum())
        assert (mask[:real] > 0).all() and (mask[real:] == 0).all()  # sequences first, padding after
        assert (np.diff(mask[:real]) >= 0).all() and set(mask[:real]) == set(range(1, count + 1))
        for k in range(1, count + 1):
            block = np.flatnonzero(mask == k)
            start = records["next_sentence_positions"][r][k - 1]
            assert block[0] == start and (np.diff(block) == 1).all()
            assert records["input_ids"][r][start] == CLS
            assert positions[block].tolist() == list(range(len(block)))
        weights = records["masked_lm_weights"][r]
        has = weights > 0
        # Each prediction points into its own sequence.
        assert (mask[records["masked_lm_positions"][r][has]] == weights[has]).all()
        assert has.sum() <= MAX_PREDICTIONS + MAX_SEQUENCES_PER_PACK


def test_packs_are_random_mixtures_and_seed_decides_them(unpacked_dir, packed_dir, tmp_path):
    settings = PackSettings(PACKED, "lp", seed=7, num_shards=2)
    pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(tmp_path), settings, num_workers=1)
    ours, theirs = packed_records(str(tmp_path)), packed_records(packed_dir)
    assert not np.array_equal(ours["input_ids"], theirs["input_ids"])
    assert content(packer.unpack(ours, UNPACKED)) == content(packer.unpack(theirs, UNPACKED))


def test_an_interrupted_run_resumes_to_the_same_output(unpacked_dir, packed_dir, tmp_path, monkeypatch):
    settings = PackSettings(PACKED, "lp", num_shards=2)
    real = pack_module._write_bucket

    def fail_on_second_bucket(*args, **kwargs):
        if args[-1] == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pack_module, "_write_bucket", fail_on_second_bucket)
    with pytest.raises(KeyboardInterrupt):
        pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(tmp_path), settings, num_workers=1)
    assert not os.path.exists(tmp_path / "metadata.json")  # nothing looks finished
    assert [n for n in os.listdir(tmp_path) if n.startswith("packed-")] == ["packed-00000-of-00002.tfrecord"]
    first_shard = os.path.getmtime(tmp_path / "packed-00000-of-00002.tfrecord")
    monkeypatch.setattr(pack_module, "_write_bucket", real)
    pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(tmp_path), settings, num_workers=1)
    assert os.path.getmtime(tmp_path / "packed-00000-of-00002.tfrecord") == first_shard  # not redone
    for a, b in zip(tfrecords(str(tmp_path)), tfrecords(packed_dir)):
        assert open(a, "rb").read() == open(b, "rb").read()


def test_a_directory_with_another_run_is_refused_and_a_finished_one_reused(unpacked_dir, packed_dir):
    with pytest.raises(OutputDirectoryError, match="already holds packed data made with other settings"):
        pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), packed_dir, PackSettings(PACKED), num_workers=1)
    before = {name: os.path.getmtime(os.path.join(packed_dir, name)) for name in os.listdir(packed_dir)}
    same = PackSettings(PACKED, "lp", num_shards=2)
    metadata = pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), packed_dir, same, num_workers=1)
    assert metadata == read_dataset_info(packed_dir).to_dict()
    assert before == {name: os.path.getmtime(os.path.join(packed_dir, name)) for name in os.listdir(packed_dir)}


def test_truncated_input_is_named_with_its_record(unpacked_dir, tmp_path):
    source = tfrecords(unpacked_dir)[0]
    broken = tmp_path / "broken.tfrecord"
    broken.write_bytes(open(source, "rb").read()[:-100])
    with pytest.raises(CorruptRecordError, match=rf"{broken}: record \d+: truncated data"):
        pack_pretraining_dataset(inputs_of([str(broken)]), str(tmp_path / "out"), PackSettings(PACKED), num_workers=1)
    assert not os.path.exists(tmp_path / "out" / "metadata.json")


def bare_copy(unpacked_dir, tmp_path) -> str:
    """A shard without its metadata.json (as the reference's own files come)."""
    os.makedirs(tmp_path / "bare", exist_ok=True)
    return shutil.copy(tfrecords(unpacked_dir)[0], tmp_path / "bare")


def test_flags_that_disagree_with_the_data_are_named(unpacked_dir, tmp_path):
    wrong = PackSettings(Shapes(64, MAX_PREDICTIONS, 3))
    with pytest.raises(RecordError, match=r"record 0: feature 'input_ids' has 128 values, expected 64 "
                                          r"\(--max_seq_length=64"):
        pack_pretraining_dataset(inputs_of([bare_copy(unpacked_dir, tmp_path)]), str(tmp_path / "out"), wrong, num_workers=1)


def test_cli_error_is_one_line_naming_the_record(unpacked_dir, tmp_path):
    from conftest import run_command

    bare = bare_copy(unpacked_dir, tmp_path)
    result = run_command("pack_pretraining_data", f"--input_files={bare}", f"--output_dir={tmp_path}/out",
                         "--max_seq_length=256")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"pack_pretraining_data: error: {bare}: record 0: feature 'input_ids' has 128 "
        f"values, expected 256 (--max_seq_length=256, --max_predictions_per_seq=76)")
    assert "Traceback" not in result.stderr and not os.path.exists(tmp_path / "out" / "metadata.json")
    # Without a metadata.json, whose L and P these are is said first: P is the default here.
    assert "no metadata.json beside the files: packing at L=256 and P=76 (the defaults where not given)" in \
        result.stderr
    described = run_command("pack_pretraining_data", f"--input_files={bare}", f"--output_dir={tmp_path}/given",
                            f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}")
    assert described.returncode == 0 and "no metadata.json" not in described.stderr, described.stderr


def test_cli_says_what_it_made_and_the_planner_plans_the_same_packs(unpacked_dir, tmp_path):
    from conftest import run_command

    packed = run_command("pack_pretraining_data", f"--input_files={unpacked_dir}/part-*.tfrecord", "--output_dir=packed",
                         f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--verify",
                         cwd=tmp_path)
    assert packed.returncode == 0, packed.stderr[-3000:]
    # It ends on one line that says what it made; metadata.json holds the figures.
    assert packed.stdout.startswith("pack_pretraining_data: ") and "verified -> packed" in packed.stdout
    metadata = json.loads((tmp_path / "packed" / "metadata.json").read_text())
    made = json.loads(open(os.path.join(unpacked_dir, "metadata.json")).read())
    assert metadata["packed"] and metadata["num_sequences"] == made["num_sequences"] > 0
    assert f"{made['num_sequences']} sequences in {metadata['num_records']} packs" in packed.stdout
    planned = run_command("plan_packing", f"--histogram={unpacked_dir}/histogram.json", "--algorithm=lp", "--json")
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert json.loads(planned.stdout)["num_packs"] == metadata["num_records"]


def unpacked_features(rows, shapes=UNPACKED):
    """The unpacked features (DESIGN schema) of `rows`."""
    seq, pred = shapes.max_seq_length, shapes.max_predictions_per_seq
    return {"input_ids": rows["input_ids"], "input_mask": (np.arange(seq) < rows["length"][:, None]).astype(int),
            "segment_ids": rows["segment_ids"], "masked_lm_positions": rows["masked_lm_positions"],
            "masked_lm_ids": rows["masked_lm_ids"],
            "masked_lm_weights": (np.arange(pred) < rows["num_predictions"][:, None]).astype(np.float32),
            "next_sentence_labels": rows["next_sentence_label"][:, None]}


def write_unpacked(path, rows):
    with TFRecordWriter(str(path)) as writer:
        writer.write_examples(unpacked_features(rows))


def test_token_ids_beyond_16_bits_pack_losslessly(tmp_path):
    """Rows keep ids as uint16 when they fit (BERT vocabularies); a multilingual id needs int32."""
    assert packer.row_dtype(UNPACKED, 30_521)["input_ids"].base == np.dtype("<u2")
    assert packer.row_dtype(UNPACKED, 119_546)["input_ids"].base == np.dtype("<i4")
    rows = random_rows(np.random.default_rng(5), 40)
    rows["input_ids"][:, 1] += 100_000
    rows["masked_lm_ids"][:, 0] = 119_546
    write_unpacked(tmp_path / "in.tfrecord", rows)
    pack_pretraining_dataset(inputs_of([str(tmp_path / "in.tfrecord")]), str(tmp_path / "out"), PackSettings(PACKED, "lp"),
                             num_workers=2)
    assert content(packer.unpack(packed_records(str(tmp_path / "out")), UNPACKED)) == content(rows)
    assert verify_packed_dataset(str(tmp_path / "out"))["num_sequences"] == 40


def test_negative_token_ids_are_named(tmp_path):
    rows = random_rows(np.random.default_rng(6), 5)
    rows["masked_lm_ids"][3, 0] = -7
    write_unpacked(tmp_path / "in.tfrecord", rows)
    with pytest.raises(RecordError, match=r"in.tfrecord: record 3: .*token ids in \[0, 2\*\*31\)"):
        pack_pretraining_dataset(inputs_of([str(tmp_path / "in.tfrecord")]), str(tmp_path / "out"), PackSettings(PACKED))


@pytest.mark.parametrize("damage", [
    lambda f: f["input_mask"][3].__setitem__(1, 0),  # a hole in the mask
    lambda f: f["input_mask"][3].__setitem__(slice(1, None), 0),  # one token
    lambda f: f["masked_lm_weights"][3].__setitem__(0, 0.0),  # weights not ones then zeros
    lambda f: f["masked_lm_positions"][3].__setitem__(0, MAX_SEQ_LENGTH - 1),  # past the sequence
])
def test_records_that_break_the_mlperf_layout_are_named(tmp_path, damage):
    rows = random_rows(np.random.default_rng(7), 5)
    features = unpacked_features(rows)
    damage(features)
    with TFRecordWriter(str(tmp_path / "in.tfrecord")) as writer:
        writer.write_examples(features)
    with pytest.raises(RecordError, match=r"in.tfrecord: record 3: expected input_mask to be at least 2 ones"):
        pack_pretraining_dataset(inputs_of([str(tmp_path / "in.tfrecord")]), str(tmp_path / "out"), PackSettings(PACKED))


def test_verify_finds_a_changed_pack(packed_dir, tmp_path):
    copy = tmp_path / "packed"
    shutil.copytree(packed_dir, copy)
    shard = tfrecords(str(copy))[1]
    [(_, batch)] = list(read_packed(shard, PACKED))
    batch["input_ids"][5, 1] += 1
    with TFRecordWriter(shard) as writer:
        writer.write_examples(batch)
    with pytest.raises(DatasetFilesError,
                       match=rf"{shard}: not the file metadata.json describes \(its first 64 KiB are others\)"):
        verify_packed_dataset(str(copy))
    metadata = json.load(open(copy / "metadata.json"))  # its size and head recorded anew: the decode finds it
    name = os.path.basename(shard)
    entry = next(f for f in metadata["files"] if f["name"] == name)
    entry.update(FileIdentity.of(shard).content)
    json.dump(metadata, open(copy / "metadata.json", "w"))
    with pytest.raises(VerifyError, match=rf"{shard}: read back .*'checksum'.*metadata.json says"):
        verify_packed_dataset(str(copy))


def test_an_input_changed_between_readings_stops_the_run(unpacked_dir, tmp_path, monkeypatch):
    source = tmp_path / "in.tfrecord"
    shutil.copy(tfrecords(unpacked_dir)[0], source)
    real_plan = pack_module.plan

    def plan_then_change_the_input(*args, **kwargs):
        rows = input_rows_of(str(source))
        rows["masked_lm_ids"][0, 0] += 1
        write_unpacked(source, rows)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(pack_module, "plan", plan_then_change_the_input)
    with pytest.raises(InputsChangedError, match=rf"{source}: changed while its output was being made"):
        pack_pretraining_dataset(inputs_of([str(source)]), str(tmp_path / "out"), PackSettings(PACKED), num_workers=1)
    assert not os.path.exists(tmp_path / "out" / "metadata.json")


def test_an_unfinished_run_of_an_older_packer_starts_over(unpacked_dir, packed_dir, tmp_path, monkeypatch):
    settings = PackSettings(PACKED, "lp", num_shards=2)
    monkeypatch.setattr(pack_module, "_write_bucket", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(tmp_path), settings, num_workers=1)
    monkeypatch.undo()
    marker = tmp_path / ".work" / "run.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "work_format": 1}))
    (tmp_path / ".work" / "bucket-00000.bin").write_bytes(b"rows of another format")
    pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(tmp_path), settings, num_workers=1)
    for a, b in zip(tfrecords(str(tmp_path)), tfrecords(packed_dir), strict=True):
        assert open(a, "rb").read() == open(b, "rb").read()


@pytest.mark.parametrize("feature, value, problem", [
    ("segment_ids", 2, "segment_ids is not 0 or 1"),
    ("segment_ids", 300, "segment_ids is not 0 or 1"),  # was stored as 44 by the int8 row
    ("next_sentence_labels", 2, "next_sentence_labels is not 0 or 1"),
    ("input_ids", 2**31, r"input_ids is outside \[0, 2\*\*31\)"),
    ("masked_lm_ids", 2**31, r"masked_lm_ids is outside \[0, 2\*\*31\)"),
    ("masked_lm_positions", "length", "masked_lm_positions points outside the sequence"),
])
def test_a_value_one_past_what_its_row_holds_is_refused_naming_it(tmp_path, feature, value, problem):
    """Nothing is narrowed silently: every value is checked against the compact row before it is stored."""
    rows = random_rows(np.random.default_rng(9), 5)
    features = unpacked_features(rows)
    features = {name: np.array(values, dtype=np.float32 if name == "masked_lm_weights" else np.int64)
                for name, values in features.items()}
    features[feature][2, 0 if feature != "segment_ids" else 1] = rows["length"][2] if value == "length" else value
    with TFRecordWriter(str(tmp_path / "in.tfrecord")) as writer:
        writer.write_examples(features)
    with pytest.raises(RecordError, match=rf"in.tfrecord: record 2: expected .*\(here {problem}\)"):
        pack_pretraining_dataset(inputs_of([str(tmp_path / "in.tfrecord")]), str(tmp_path / "out"), PackSettings(PACKED))
    assert not os.path.exists(tmp_path / "out" / "metadata.json")
