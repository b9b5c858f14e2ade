"""Bad input of every kind: one line naming the file, flag or record, exit status 2, nothing written.

Every case runs its command in this process (conftest.run_command): what a subprocess would
return, without starting one.
"""

import json
import os
import re

import numpy as np
import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, VOCAB, command_in_this_process, run_command, tfrecords

from bert_packed.records import TFRecordWriter


def command(script, *args):
    """Runs scripts/<name>.py, bert_packed/cli/<name>.py or run_pretraining.py with `args`."""
    return run_command(os.path.splitext(os.path.basename(script))[0], *args)


def assert_one_line(result, message):
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in result.stderr.strip().splitlines()[-1], result.stderr[-3000:]
    assert "Traceback" not in result.stderr


@pytest.fixture
def create_args(corpus, tmp_path):
    return [f"--input_file={','.join(corpus)}", f"--vocab_file={VOCAB}", f"--max_seq_length={MAX_SEQ_LENGTH}",
            f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--dupe_factor=1", "--num_workers=1"]


@pytest.mark.parametrize("extra, message", [
    (["--random_seed=-1"], "--random_seed=-1: must be >= 0"),
    (["--num_workers=-2"], "--num_workers=-2: must be >= 0"),
    (["--eval_fraction=0.999"], "no training instances from 2 input files: --eval_fraction=0.999 held out every"),
])
def test_create_refuses_bad_settings(create_args, tmp_path, extra, message):
    out = tmp_path / "out"
    result = command("scripts/create_pretraining_data.py", *create_args, f"--output_dir={out}", *extra)
    assert_one_line(result, message)
    assert not (out / "metadata.json").exists()


def test_create_refuses_a_binary_vocabulary_and_an_output_dir_that_is_a_file(create_args, tmp_path):
    binary = tmp_path / "vocab.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    result = command("scripts/create_pretraining_data.py", *[a for a in create_args if "vocab" not in a],
                     f"--vocab_file={binary}", f"--output_dir={tmp_path / 'out'}")
    assert_one_line(result, f"{binary}: not a text vocabulary (byte 128 is not UTF-8)")
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    result = command("scripts/create_pretraining_data.py", *create_args, f"--output_dir={a_file}")
    assert_one_line(result, f"{a_file}: exists and is not a directory")
    assert a_file.read_text() == "keep me"


def test_create_refuses_a_directory_of_packed_data(create_args, packed_dir, tmp_path):
    import shutil

    copy = tmp_path / "packed"
    shutil.copytree(packed_dir, copy)
    before = (copy / "metadata.json").read_text()
    result = command("scripts/create_pretraining_data.py", *create_args, f"--output_dir={copy}")
    assert_one_line(result, f"{copy}: holds packed data; unpacked data would be mixed into it")
    assert (copy / "metadata.json").read_text() == before


@pytest.mark.parametrize("extra, message", [
    (["--seed=-1"], "--seed=-1: must be >= 0"),
    (["--num_workers=-2"], "--num_workers=-2: must be >= 0"),
])
def test_pack_refuses_bad_settings(unpacked_dir, tmp_path, extra, message):
    result = command("scripts/pack_pretraining_data.py", f"--input_files={unpacked_dir}/part-*.tfrecord",
                     f"--output_dir={tmp_path / 'out'}", f"--max_seq_length={MAX_SEQ_LENGTH}",
                     f"--max_predictions_per_seq={MAX_PREDICTIONS}", *extra)
    assert_one_line(result, message)
    assert not (tmp_path / "out").exists()


def test_pack_names_int64_masked_lm_weights(tmp_path):
    length, predictions = MAX_SEQ_LENGTH, MAX_PREDICTIONS
    features = {"input_ids": np.full((2, length), 5), "input_mask": np.ones((2, length), int),
                "segment_ids": np.zeros((2, length), int), "masked_lm_positions": np.ones((2, predictions), int),
                "masked_lm_ids": np.full((2, predictions), 7), "masked_lm_weights": np.ones((2, predictions), int),
                "next_sentence_labels": np.zeros((2, 1), int)}
    with TFRecordWriter(str(tmp_path / "in.tfrecord")) as writer:
        writer.write_examples(features)
    result = command("scripts/pack_pretraining_data.py", f"--input_files={tmp_path}/in.tfrecord",
                     f"--output_dir={tmp_path / 'out'}", f"--max_seq_length={length}",
                     f"--max_predictions_per_seq={predictions}")
    assert_one_line(result, "in.tfrecord: record 0: feature 'masked_lm_weights' is a int64_list, expected a "
                            "float_list")


def test_plan_refuses_a_length_beyond_any_bert(tmp_path):
    path = tmp_path / "h.json"
    path.write_text('{"max_sequence_length": 100000000, "histogram": [1]}')  # 60 bytes asking for 800 MB
    result = command("scripts/../bert_packed/cli/plan_packing.py", f"--histogram={path}")
    assert_one_line(result, "max_sequence_length 100,000,000 is beyond any BERT; this planner takes up to 65,536")
    path.write_text(json.dumps([2**63, 1]))
    result = command("bert_packed/cli/plan_packing.py", f"--histogram={path}")
    assert_one_line(result, "count for length 1 is 9223372036854775808; counts must be below 2**62")


def test_verbosity_1_shows_the_traceback_of_an_error_and_a_bug_is_never_taken_for_bad_input(tmp_path, monkeypatch):
    from bert_packed.packing.plan import ALGORITHMS

    path = tmp_path / "h.json"
    path.write_text("[1, 2, 3]")
    quiet = run_command("plan_packing", f"--histogram={tmp_path}/missing.json")
    verbose = run_command("plan_packing", f"--histogram={tmp_path}/missing.json", "--verbosity=1")
    assert quiet.returncode == verbose.returncode == 2 and "Traceback" not in quiet.stderr
    assert "Traceback (most recent call last)" in verbose.stderr
    assert verbose.stderr.strip().splitlines()[-1] == quiet.stderr.strip().splitlines()[-1]
    # A bug (here a KeyError in the planner): the traceback, then one line that says it is one.
    monkeypatch.setitem(ALGORITHMS, "lp", lambda histogram, depth: {}["strategies"])
    bug = run_command("plan_packing", f"--histogram={path}", "--algorithm=lp")
    assert bug.returncode == 1 and "Traceback (most recent call last)" in bug.stderr
    assert bug.stderr.strip().splitlines()[-1] == (
        "plan_packing: internal error: KeyError: 'strategies' (a bug, not your input: please report it with the "
        "traceback above; exit status 1)")
    # TensorFlow's NotFoundError (also a missing kernel's) and an OSError that no storage request
    # raised are bugs too: only the storage layer says what is the user's path (bert_packed.storage.files).
    import tensorflow as tf

    for error in (tf.errors.NotFoundError(None, None, "No registered 'Foo' OpKernel for 'CPU' devices"),
                  FileNotFoundError(2, "No such file or directory", "/the/code/s/own/path")):
        monkeypatch.setitem(ALGORITHMS, "lp", lambda histogram, depth, error=error: (_ for _ in ()).throw(error))
        bug = run_command("plan_packing", f"--histogram={path}", "--algorithm=lp")
        assert bug.returncode == 1 and "Traceback (most recent call last)" in bug.stderr
        assert bug.stderr.strip().splitlines()[-1].startswith(f"plan_packing: internal error: {type(error).__name__}: ")


@pytest.mark.parametrize("change, message", [
    ({"hidden_dropout_prob": "0.1"}, "hidden_dropout_prob must be a number, got '0.1'"),
    ({"vocab_size": 2**40}, "vocab_size must be a positive integer below 2**31"),
    ({"vocab_size": 1000}, "--input_file: made with a vocabulary of 1,"),  # metadata.json says (test_vocabulary)
    ({"type_vocab_size": 1}, "segment_ids holds a segment id at or above type_vocab_size=1 of the BERT config"),
])
def test_train_refuses_a_bert_config_that_cannot_work(packed_dir, bert_config_file, tmp_path, change, message):
    config = {**json.load(open(bert_config_file)), **change}
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    result = command("run_pretraining.py", f"--bert_config_file={tmp_path / 'bert_config.json'}",
                     f"--input_file={packed_dir}/packed-*.tfrecord", f"--output_dir={tmp_path / 'run'}",
                     f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}",
                     "--train_batch_size=4", "--num_train_steps=2")
    assert_one_line(result, message)
    assert not list((tmp_path / "run").glob("checkpoints/*.index"))


def test_train_refuses_a_token_id_beyond_the_vocabulary_at_the_batch_that_holds_it(unpacked_dir, bert_config_file,
                                                                                  tmp_path):
    """Records no metadata.json describes (the reference's own) say nothing of their vocabulary:
    the first batch that holds a token id the BERT config lacks is refused."""
    config = {**json.load(open(bert_config_file)), "vocab_size": 1000}
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    (tmp_path / "bare").mkdir()
    for path in tfrecords(unpacked_dir):
        os.link(path, tmp_path / "bare" / os.path.basename(path))
    result = command("run_pretraining.py", f"--bert_config_file={tmp_path / 'bert_config.json'}",
                     f"--input_file={tmp_path}/bare/part-*.tfrecord", f"--output_dir={tmp_path / 'run'}",
                     f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}",
                     "--train_batch_size=4", "--num_train_steps=2")
    assert_one_line(result, "input_ids holds a token id at or above vocab_size=1000 of the BERT config")
    assert not list((tmp_path / "run").glob("checkpoints/*.index"))


def test_train_refuses_a_negative_seed_and_an_output_dir_that_is_a_file(packed_dir, bert_config_file, tmp_path):
    base = [f"--bert_config_file={bert_config_file}", f"--input_file={packed_dir}/packed-*.tfrecord",
            f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}"]
    assert_one_line(command("run_pretraining.py", *base, f"--output_dir={tmp_path / 'run'}", "--seed=-1"),
                    "--seed=-1: must be >= 0")
    assert_one_line(command("run_pretraining.py", *base, f"--output_dir={tmp_path / 'run'}", "--seed=4294967296",
                            "--deterministic"),
                    "--seed=4294967296: with --deterministic, below 2**32")  # was an internal error in NumPy's seeding
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    assert_one_line(command("run_pretraining.py", *base, f"--output_dir={a_file}"),
                    f"{a_file}: exists and is not a directory")
    assert tfrecords(packed_dir)


# A path no process may create, root included: sysfs refuses every mkdir.
UNWRITABLE = "/sys/bert_packed_cannot_write_here/out"
# A directory that is there and takes no file, root's included (sysfs).
EXISTING_UNWRITABLE = "/sys/kernel"


@pytest.mark.parametrize("extra, message", [
    (["--max_seq_length=100000000"], "--max_seq_length=100000000: must be in [8, 65,536]"),
    ([f"--output_dir={UNWRITABLE}"], "/sys/bert_packed_cannot_write_here: Operation not permitted"),
    ([f"--output_dir=file://{UNWRITABLE}"], "Operation not permitted"),  # TensorFlow's error: was "internal error"
])
def test_create_refuses_an_impossible_length_and_an_unwritable_directory(create_args, tmp_path, extra, message):
    result = command("scripts/create_pretraining_data.py", *create_args, f"--output_dir={tmp_path / 'out'}", *extra)
    assert_one_line(result, message)


def test_create_refuses_a_device_a_file_beyond_its_work_unit_and_a_symlink_loop(create_args, tmp_path):
    args = [a for a in create_args if not a.startswith("--input_file")] + [f"--output_dir={tmp_path / 'out'}"]
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(200 << 20)  # 200 MB, sparse
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for path, message in (("/dev/zero", "/dev/zero: not a regular file"),
                          (huge, f"{huge}: 200 MB; one input file is one unit of work held in memory, at most 32 MB"),
                          (tmp_path / "loop", "loop: cannot read: Too many levels of symbolic links")):
        assert_one_line(command("scripts/create_pretraining_data.py", f"--input_file={path}", *args), message)


def test_pack_refuses_a_symlink_loop_its_glob_matches_and_an_unwritable_directory(unpacked_dir, tmp_path):
    import shutil

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for path in tfrecords(unpacked_dir):
        shutil.copy(path, inputs)
    (inputs / "part-99999-000.tfrecord").symlink_to(inputs / "part-99999-000.tfrecord")
    base = [f"--input_files={inputs}/part-*.tfrecord", f"--max_seq_length={MAX_SEQ_LENGTH}",
            f"--max_predictions_per_seq={MAX_PREDICTIONS}"]
    result = command("scripts/pack_pretraining_data.py", *base, f"--output_dir={tmp_path / 'out'}")
    assert_one_line(result, "part-99999-000.tfrecord: Too many levels of symbolic links")
    (inputs / "part-99999-000.tfrecord").unlink()
    result = command("scripts/pack_pretraining_data.py", *base, f"--output_dir={UNWRITABLE}")
    assert_one_line(result, "/sys/bert_packed_cannot_write_here: Operation not permitted")
    result = command("scripts/pack_pretraining_data.py", *base, f"--output_dir=file://{UNWRITABLE}")
    assert_one_line(result, "Operation not permitted")
    # A directory that is there but refuses files: the line names the flag and the directory, not
    # the lock file written first in it (that write was outside the storage layer: an internal
    # error, exit 1).
    for output in (EXISTING_UNWRITABLE, f"file://{EXISTING_UNWRITABLE}"):
        result = command("scripts/pack_pretraining_data.py", *base, f"--output_dir={output}")
        assert_one_line(result, f"pack_pretraining_data: error: --output_dir: {output}: Permission denied; give an "
                                f"--output_dir this process may write to")


def test_an_output_file_that_is_a_directory_is_refused_before_the_work(create_args, tmp_path):
    """(It was found at the end, the work done and left in <output_file>.parts beside it.)"""
    (tmp_path / "out").mkdir()
    result = command("scripts/create_pretraining_data.py", *create_args, f"--output_file={tmp_path / 'out'}")
    assert_one_line(result, f"--output_file={tmp_path / 'out'}: a directory; give a file's path")
    assert sorted(os.listdir(tmp_path)) == ["out"]
    # In a directory that takes no file: the line names the flag and the file, not its work (.parts).
    output = f"{EXISTING_UNWRITABLE}/out.tfrecord"
    for outputs in (output, f"{tmp_path / 'a'},{output}"):  # the second of two: made from the first's work
        result = command("scripts/create_pretraining_data.py", *create_args, f"--output_file={outputs}")
        assert_one_line(result, f"create_pretraining_data: error: --output_file: {output}: ")
        assert result.stderr.strip().endswith("; give an --output_file this process may write to"), result.stderr


CASES = ["--eval_batch_size=0", "--eval_batch_size=-3", "--learning_rate=-1", "--lamb_weight_decay_rate=-0.1",
         "--poly_power=-1", "--log_every_steps=0", "--lamb_beta_1=1.5", "--target_mlm_accuracy=2",
         "--max_sequences_per_pack=0"]


def test_train_checks_every_value_before_any_work(packed_dir, unpacked_dir, bert_config_file, tmp_path):

    from bert_packed.errors import UserError
    from bert_packed.training.assemble import assemble

    base = [f"--bert_config_file={bert_config_file}", f"--input_file={packed_dir}/packed-*.tfrecord",
            f"--eval_files={unpacked_dir}/part-*.tfrecord", f"--output_dir={tmp_path / 'run'}",
            f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}"]
    said = {}
    with command_in_this_process("run_pretraining") as run_pretraining:
        for case in CASES:
            run_pretraining.FLAGS.unparse_flags()
            run_pretraining.FLAGS(["run_pretraining", *base, case])
            try:
                assemble(run_pretraining.settings_from_flags())
                said[case] = "accepted"
            except UserError as e:
                said[case] = str(e)
    assert said == {
        "--eval_batch_size=0": "--eval_batch_size=0: must be >= 1",
        "--eval_batch_size=-3": "--eval_batch_size=-3: must be >= 1",
        "--learning_rate=-1": "--learning_rate=-1.0: must be a number >= 0",
        "--lamb_weight_decay_rate=-0.1": "--lamb_weight_decay_rate=-0.1: must be >= 0",
        "--poly_power=-1": "--poly_power=-1.0: must be >= 0",
        "--log_every_steps=0": "--log_every_steps=0: must be >= 1",
        "--lamb_beta_1=1.5": "--lamb_beta_1=1.5: must be in [0, 1)",
        "--target_mlm_accuracy=2": "--target_mlm_accuracy=2.0: must be in [0, 1]",
        "--max_sequences_per_pack=0": "--input_file: packed with max_sequences_per_pack=3, but --max_sequences_per_pack=0",
    }
    assert not (tmp_path / "run").exists()


def test_train_refuses_an_unwritable_output_dir(packed_dir, bert_config_file):
    result = command("run_pretraining.py", f"--bert_config_file={bert_config_file}",
                     f"--input_file={packed_dir}/packed-*.tfrecord", f"--output_dir={UNWRITABLE}",
                     f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}")
    assert_one_line(result, "Operation not permitted")


def test_train_refuses_at_start_an_unwritable_export_dir_and_compressed_eval_files(packed_dir, unpacked_dir,
                                                                                   bert_config_file, tmp_path):
    """Both were found after the training: the export at the end, the eval files at the first evaluation."""
    import gzip

    common = [f"--bert_config_file={bert_config_file}", f"--input_file={packed_dir}/packed-*.tfrecord",
              f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}",
              f"--vocab_file={VOCAB}"]
    result = command("run_pretraining.py", *common, f"--output_dir={tmp_path / 'a'}",
                     f"--export_huggingface_dir={UNWRITABLE}")
    assert_one_line(result, "run_pretraining: error: --export_huggingface_dir: /sys/bert_packed_cannot_write_here: "
                            "Operation not permitted; give an --export_huggingface_dir this process may write to")
    compressed = tmp_path / "eval.tfrecord"
    compressed.write_bytes(gzip.compress(open(tfrecords(unpacked_dir)[0], "rb").read()))
    result = command("run_pretraining.py", *common, f"--output_dir={tmp_path / 'b'}", f"--eval_files={compressed}")
    assert_one_line(result, f"run_pretraining: error: --eval_files: {compressed} is gzip-compressed; TFRecord files "
                            f"are read uncompressed: decompress it first")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b" / "train_log.jsonl").exists()


@pytest.mark.parametrize("script, flags", [
    ("scripts/create_pretraining_data.py", ["--input_file", "--output_dir"]),
    ("scripts/pack_pretraining_data.py", ["--input_files", "--output_dir"]),
    ("run_pretraining.py", ["--input_files", "--output_dir", "--bert_config_file"]),
    ("scripts/pick_eval_samples.py", ["--input_tfrecord", "--output_tfrecord"]),
    ("bert_packed/cli/plan_packing.py", ["--histogram"]),
])
def test_an_unquoted_glob_the_shell_expanded_is_refused_with_a_hint(unpacked_dir, tmp_path, script, flags):
    """`--input_files=DIR/part-*.tfrecord` unquoted: the shell gives the first file to the flag and
    the others as arguments, which every command but compare_curves refuses, naming them."""
    first, *others = tfrecords(unpacked_dir)
    given = [f"{flags[0]}={first}", *(f"{flag}={tmp_path / 'out'}" for flag in flags[1:])]
    result = command(script, *given, *others)
    assert_one_line(result, f"unexpected argument {others[0]!r} ({len(others)} in all): this command takes flags "
                            f"only. A glob the shell expanded? Quote it, as in --input_files='DIR/part-*.tfrecord'")
    assert os.listdir(tmp_path) == []  # nothing written


def test_every_command_reads_a_set_of_files_once(corpus, create_args, unpacked_dir, packed_dir, bert_config_file,
                                                 tmp_path):
    """A file matched by two globs or spelled two ways, a copy of a file, an empty file: refused
    by every command before any work; and no training file is an eval file, by path or content."""
    import shutil

    shard = tfrecords(packed_dir)[0]
    copy = tmp_path / "copy.tfrecord"
    shutil.copy(shard, copy)
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    run = ["run_pretraining.py", f"--bert_config_file={bert_config_file}", f"--output_dir={tmp_path / 'run'}",
           f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--num_train_steps=1"]
    for given, message in [
        (f"{packed_dir}/packed-*.tfrecord,{shard}", f"--input_file: {shard} is matched twice ('{packed_dir}/packed-*"
                                                    f".tfrecord' gives {shard}, '{shard}' gives it again)"),
        (f"{shard},{os.path.dirname(shard)}/../{os.path.basename(packed_dir)}/{os.path.basename(shard)}",
         "is matched twice"),
        (f"{shard},{copy}", f"--input_file: {shard} and {copy} hold the same bytes (a copy, or one file linked "
                            f"twice)"),
        (f"{shard},{empty}", f"--input_file: {empty} is empty"),
    ]:
        assert_one_line(command(*run, f"--input_files={given}"), message)
    assert_one_line(command(*run, f"--input_files={packed_dir}/packed-*.tfrecord", f"--eval_files={shard}"),
                    f"--eval_files: {shard} is given by --input_file too; the eval set is never training input")
    assert_one_line(command(*run, f"--input_files={packed_dir}/packed-*.tfrecord", f"--eval_files={copy}"),
                    f"--eval_files: {copy} holds the same bytes as {shard}, given by --input_file too")
    assert not (tmp_path / "run").exists()
    # The data tools: the same text file twice would hold out different documents in each copy.
    text = corpus[0]
    result = command("scripts/create_pretraining_data.py", *[a for a in create_args if "input_file" not in a],
                     f"--input_file={text},{text}", f"--output_dir={tmp_path / 'created'}")
    assert_one_line(result, f"--input_file: {text} is matched twice")
    part = tfrecords(unpacked_dir)[0]
    result = command("scripts/pack_pretraining_data.py", f"--input_files={part},{unpacked_dir}/part-*.tfrecord",
                     f"--output_dir={tmp_path / 'packed'}", f"--max_seq_length={MAX_SEQ_LENGTH}",
                     f"--max_predictions_per_seq={MAX_PREDICTIONS}")
    assert_one_line(result, f"--input_files: {part} is matched twice")
    assert not (tmp_path / "created").exists() and not (tmp_path / "packed").exists()


def test_a_set_of_files_tells_copies_from_files_that_only_begin_alike(tmp_path):
    """Size and the first 64 KiB only point at a copy: it is confirmed whole, against every file
    that begins alike; devices and directories are refused before any work."""
    from bert_packed.errors import InputFilesError
    from bert_packed.inputs.input_files import expand_globs, require_disjoint

    a = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    b = a[:-1] + bytes([a[-1] ^ 1])  # the same size and first 64 KiB, another last byte
    for name, content in (("a", a), ("b", b), ("c", b)):
        (tmp_path / name).write_bytes(content)
    assert expand_globs(f"{tmp_path}/a,{tmp_path}/b", "--x") == [f"{tmp_path}/a", f"{tmp_path}/b"]
    with pytest.raises(InputFilesError, match=rf"^--x: {tmp_path}/b and {tmp_path}/c hold the same bytes"):
        expand_globs(f"{tmp_path}/[abc]", "--x")
    require_disjoint([f"{tmp_path}/a"], "--input_file", [f"{tmp_path}/b"], "--eval_files")
    with pytest.raises(InputFilesError, match=rf"^--eval_files: {tmp_path}/c holds the same bytes as {tmp_path}/b, "
                                              r"given by --input_file too"):
        require_disjoint([f"{tmp_path}/a", f"{tmp_path}/b"], "--input_file", [f"{tmp_path}/c"], "--eval_files")
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a").write_bytes(a)
    for given, message in ((f"{tmp_path}/a,/dev/null", "/dev/null: not a regular file"),
                           (f"{tmp_path}/d/*", f"{tmp_path}/d/sub: not a regular file"),
                           (f"file://{tmp_path}/d/*", f"file://{tmp_path}/d/sub: not a regular file")):
        with pytest.raises(InputFilesError, match=re.escape(message)):
            expand_globs(given, "--x")


def test_pick_refuses_training_records_and_the_planner_a_histogram_that_never_ends(unpacked_dir, tmp_path):
    from bert_packed.errors import SettingsError
    from bert_packed.pretraining_data.eval_samples import PickSettings, pick_eval_samples

    # The picked file has no metadata.json: no later command could tell that it was trained on.
    picked = run_command("pick_eval_samples", f"--input_tfrecord={tfrecords(unpacked_dir)[0]}",
                         f"--output_tfrecord={tmp_path}/picked", "--num_examples_to_pick=2",
                         f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}")
    assert_one_line(picked, f"--input_tfrecord={tfrecords(unpacked_dir)[0]}: a training shard of {unpacked_dir}")
    assert not os.path.exists(tmp_path / "picked")
    # The function refuses as the command does (it holds the checks), and with no file named.
    with pytest.raises(SettingsError, match="a training shard of"):
        pick_eval_samples(PickSettings(input_tfrecord=tfrecords(unpacked_dir)[0], output_tfrecord=f"{tmp_path}/picked"))
    with pytest.raises(SettingsError, match="--output_tfrecord: not given"):
        pick_eval_samples(PickSettings(input_tfrecord=tfrecords(unpacked_dir)[0]))
    with pytest.raises(SettingsError, match="--max_predictions_per_seq=-1: must be from 1 to --max_seq_length=512"):
        PickSettings(max_predictions_per_seq=-1)  # TensorFlow's shape error, a traceback
    with pytest.raises(SettingsError, match=r"--num_examples_to_pick='5': a str; expected an integer"):
        PickSettings(num_examples_to_pick="5")  # a TypeError
    os.mkfifo(tmp_path / "fifo")  # read, it would block; /dev/zero never ends
    for path in ("/dev/zero", tmp_path / "fifo"):
        assert_one_line(run_command("plan_packing", f"--histogram={path}"), f"{path}: not a regular file")


def test_l_and_p_come_from_the_data_s_metadata_when_not_given(packed_dir, unpacked_dir, bert_config_file, tmp_path):

    from bert_packed.inputs.dataset_info import read_dataset_info
    from bert_packed.training.assemble import assemble

    packed = run_command("pack_pretraining_data", f"--input_files={unpacked_dir}/part-*.tfrecord",
                         f"--output_dir={tmp_path / 'p'}", "--num_shards=2")
    assert packed.returncode == 0, packed.stderr[-3000:]
    assert read_dataset_info(str(tmp_path / "p")).shapes == read_dataset_info(packed_dir).shapes
    with command_in_this_process("run_pretraining") as run_pretraining:
        run_pretraining.FLAGS.unparse_flags()  # an earlier run's values: each run parses from the defaults
        run_pretraining.FLAGS(["run_pretraining", f"--bert_config_file={bert_config_file}",
                               f"--input_files={packed_dir}/packed-*.tfrecord", f"--output_dir={tmp_path / 'run'}"])
        _, train_data, _ = assemble(run_pretraining.settings_from_flags())
    assert (train_data.shapes.max_seq_length, train_data.shapes.max_predictions_per_seq) == (MAX_SEQ_LENGTH,
                                                                                              MAX_PREDICTIONS)
    # Given and different from what the data records: one line, as before.
    other = run_command("pack_pretraining_data", f"--input_files={unpacked_dir}/part-*.tfrecord",
                        f"--output_dir={tmp_path / 'q'}", "--max_seq_length=256")
    assert other.returncode == 2
    assert other.stderr.strip().splitlines()[-1].endswith(f"metadata.json says max_seq_length={MAX_SEQ_LENGTH}, "
                                                          f"but --max_seq_length=256")


def test_an_unknown_flag_in_a_flagfile_names_the_flagfile_and_line(tmp_path):
    inner, outer = tmp_path / "inner.cfg", tmp_path / "outer.cfg"
    inner.write_text("--max_seq_length=128\n--bogus_flag=3\n")
    outer.write_text(f"--train_batch_size=8\n--flagfile={inner}\n")
    assert_one_line(command("run_pretraining.py", f"--flagfile={outer}"),
                    f"run_pretraining: error: {inner}:2: unknown flag --bogus_flag (no flag of this command has "
                    f"that name)")
    assert_one_line(command("run_pretraining.py", "--bogus_flag=3"),
                    "run_pretraining: error: Unknown command line flag 'bogus_flag'")
    nested = tmp_path / "nested.cfg"
    nested.write_text("--train_batch_size=8\n--flagfile=inner.cfg\n")  # beside it, but read from the cwd
    assert_one_line(command("run_pretraining.py", f"--flagfile={nested}"),
                    f"run_pretraining: error: {nested}:2: --flagfile=inner.cfg: cannot read it ([Errno 2] No such "
                    f"file or directory: 'inner.cfg'); a flagfile's path is read from the current directory, not from "
                    f"the flagfile's")
    (tmp_path / "binary.cfg").write_bytes(b"\x1f\x8b\x08\x00\xff\xfe--x\n")
    assert_one_line(command("run_pretraining.py", f"--flagfile={tmp_path / 'binary.cfg'}"),
                    "run_pretraining: error: --flagfile: not UTF-8 text (a compressed or binary file?); a flagfile "
                    "holds one flag a line")
    assert_one_line(command("scripts/pack_pretraining_data.py", f"--flagfile={tmp_path / 'missing.cfg'}"),
                    f"pack_pretraining_data: error: --flagfile: cannot read it ([Errno 2] No such file or directory: "
                    f"'{tmp_path / 'missing.cfg'}')")
