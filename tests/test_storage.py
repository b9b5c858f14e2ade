"""The data tools on any filesystem tf.io.gfile knows: `file://` URIs go through it exactly as
`gs://` does, so they test a bucket's code path without a bucket (docs/reliability.md)."""

import ast
import json
import os
import subprocess
import sys

import pytest
from conftest import (
    MAX_PREDICTIONS,
    MAX_SEQ_LENGTH,
    MAX_SEQUENCES_PER_PACK,
    REPO,
    VOCAB,
    dataset_settings,
    inputs_of,
    run_command,
)

from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import read_dataset_info
from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset
from bert_packed.packing.verify import verify_packed_dataset
from bert_packed.pretraining_data.create_dataset import create_pretraining_dataset
from bert_packed.records.tfrecord import read_records
from bert_packed.storage import files, locks
from bert_packed.storage.locks import DirectoryLockedError

SETTINGS = PackSettings(Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK), "lp", num_shards=2)


def uri(path) -> str:
    return "file://" + os.fspath(path)


def contents(directory) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory)) if name.endswith(".tfrecord")}


def test_create_and_pack_through_tf_io_gfile_write_what_they_write_on_plain_paths(corpus, unpacked_dir, packed_dir,
                                                                                  tmp_path, caplog):
    unpacked, packed = tmp_path / "un packed [1]", tmp_path / "packed?"
    created = create_pretraining_dataset([uri(path) for path in corpus], uri(unpacked), dataset_settings(),
                                         num_workers=1)
    assert contents(unpacked) == contents(unpacked_dir)
    assert created["num_sequences"] == read_dataset_info(unpacked_dir).num_sequences
    parts = [uri(unpacked / name) for name in contents(unpacked)]
    metadata = pack_pretraining_dataset(inputs_of(parts), uri(packed), SETTINGS, num_workers=1)
    assert contents(packed) == contents(packed_dir)
    assert metadata["checksum"] == read_dataset_info(packed_dir).checksum
    assert verify_packed_dataset(uri(packed))["num_sequences"] == metadata["num_sequences"]
    assert not [name for name in os.listdir(packed) if name.startswith(".")]  # no work, no lock, no leftovers
    # Done: the same calls again find it so and change nothing.
    caplog.set_level("INFO")
    assert create_pretraining_dataset([uri(path) for path in corpus], uri(unpacked), dataset_settings(),
                                      num_workers=1) == created
    assert pack_pretraining_dataset(inputs_of(parts), uri(packed), SETTINGS, num_workers=1) == metadata
    assert caplog.text.count("nothing to do") == 2
    # A bucket cannot lock: a local file named after the output stands in, so that two writers on
    # one host never interleave.
    (tmp_path / "again").mkdir()
    with locks.exclusive(uri(tmp_path / "again" / ".lock"), "another packer"):
        with pytest.raises(DirectoryLockedError, match=r"another packer"):
            pack_pretraining_dataset(inputs_of(parts), uri(tmp_path / "again"), SETTINGS, num_workers=1)
    assert not os.listdir(tmp_path / "again")


def claim_of(host: str, pid: int) -> str:
    return json.dumps({"command": "pack_pretraining_data", "host": host, "pid": pid, "started": "2026-11-24 09:00:00"})


@pytest.mark.slow
def test_a_claim_on_a_bucket_keeps_other_hosts_out_and_a_replaced_claim_commits_nothing(unpacked_dir, tmp_path,
                                                                                          monkeypatch):
    """A bucket cannot lock: the claim written into the output names its writer to other hosts."""
    import socket

    from bert_packed.packing import pack_dataset

    out = tmp_path / "packed"
    out.mkdir()
    parts = [uri(os.path.join(unpacked_dir, name)) for name in contents(unpacked_dir)]
    (out / ".lock").write_text(claim_of("node-7", 1))  # another host's: it may still run
    with pytest.raises(DirectoryLockedError, match=rf"^file://{out}: in use by pack_pretraining_data \(pid 1 on node-7, "
                                                   rf"since 2026-11-24 09:00:00\).*remove file://{out}/.lock\)$"):
        pack_pretraining_dataset(inputs_of(parts), uri(out), SETTINGS, num_workers=1)
    assert sorted(os.listdir(out)) == [".lock"]
    # This host's process that no longer runs left it: taken over, as a local lock is.
    ended = subprocess.Popen(["true"])
    ended.wait()
    (out / ".lock").write_text(claim_of(socket.gethostname(), ended.pid))
    # Another host claimed the output while this run packed: the run commits nothing.
    describe = pack_dataset._description

    def replaced_meanwhile(*args):
        (out / ".lock").write_text(claim_of("node-8", 2))
        return describe(*args)

    monkeypatch.setattr(pack_dataset, "_description", replaced_meanwhile)
    with pytest.raises(DirectoryLockedError, match=r"another process claimed it during this run \("
                                                   r"pack_pretraining_data \(pid 2 on node-8.*nothing was committed"):
        pack_pretraining_dataset(inputs_of(parts), uri(out), SETTINGS, num_workers=1)
    assert read_dataset_info(out) is None
    assert json.loads((out / ".lock").read_text())["host"] == "node-8"  # its claim is left to it
    monkeypatch.setattr(pack_dataset, "_description", describe)
    (out / ".lock").unlink()  # what the message says to do once that run has ended
    assert pack_pretraining_dataset(inputs_of(parts), uri(out), SETTINGS, num_workers=1)["num_sequences"] == \
        read_dataset_info(unpacked_dir).num_sequences
    assert not [name for name in os.listdir(out) if name.startswith(".")]


def test_a_request_the_storage_still_fails_after_retrying_stops_in_one_line_and_the_same_command_goes_on(
        corpus, unpacked_dir, tmp_path, monkeypatch):
    import tensorflow as tf

    out = tmp_path / "u"
    create = [f"--input_file={','.join(uri(path) for path in corpus)}", f"--vocab_file={uri(VOCAB)}",
              f"--output_dir={uri(out)}", f"--max_seq_length={MAX_SEQ_LENGTH}",
              f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--dupe_factor=2", "--short_seq_prob=0.5",
              "--num_workers=1"]
    rename, moved = tf.io.gfile.rename, []

    def unavailable_at_the_third_shard(source, destination, overwrite=False):  # as a bucket's client fails
        if destination.endswith(".tfrecord"):
            moved.append(destination)
            if len(moved) == 3:
                raise tf.errors.UnavailableError(None, None, f"Error executing an HTTP request: HTTP response code "
                                                             f"503 when renaming {source} to {destination}")
        rename(source, destination, overwrite=overwrite)

    monkeypatch.setattr(tf.io.gfile, "rename", unavailable_at_the_third_shard)
    stopped = run_command("create_pretraining_data", *create)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"create_pretraining_data: the storage failed a request, retried (UnavailableError: Error executing an HTTP "
        f"request: HTTP response code 503 when renaming {files.temporary_name(moved[2])} to {moved[2]}). Finished "
        f"shards are kept, and nothing half-written is taken for finished: run the same command again to continue "
        f"(exit status 75)")
    assert sorted(os.listdir(out)) == [".work", "part-00000-000.tfrecord",
                                       "part-00000-001.tfrecord"]  # the third shard's temporary file removed
    monkeypatch.setattr(tf.io.gfile, "rename", rename)
    again = run_command("create_pretraining_data", *create)
    assert again.returncode == 0, again.stderr[-3000:]
    assert contents(out) == contents(unpacked_dir)
    assert sorted(os.listdir(out)) == sorted(os.listdir(unpacked_dir))



def test_a_glob_the_storage_still_fails_after_retrying_keeps_its_status(corpus, tmp_path, monkeypatch):
    """Matching --input_file on a bucket out of reach is no bad input: exit 75 (the same command
    again goes on), not 2; a glob the storage refuses stays a one-line refusal of the flag."""
    import tensorflow as tf

    create = [f"--input_file={uri(corpus[0])}*", f"--vocab_file={uri(VOCAB)}", f"--output_dir={uri(tmp_path / 'u')}",
              f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--num_workers=1"]
    for error, status in ((tf.errors.UnavailableError, 75), (tf.errors.PermissionDeniedError, 2)):
        def failing(pattern, error=error):
            raise error(None, None, f"{pattern}; the bucket answered 503")

        monkeypatch.setattr(tf.io.gfile, "glob", failing)
        result = run_command("create_pretraining_data", *create)
        assert result.returncode == status, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and "the bucket answered 503" in result.stderr.strip().splitlines()[-1]
        assert status == 2 or f"failed a request on {uri(corpus[0])}*, retried" in result.stderr  # what it matched
        assert not (tmp_path / "u").exists()


def test_a_file_a_reader_cannot_read_for_a_storage_that_still_fails_keeps_the_retry_status(unpacked_dir, monkeypatch):
    """A reader's own refusal ("cannot read the histogram file") raised on a failure that retrying
    may get past ends with that failure's status, 75, and its words."""
    import tensorflow as tf

    def unavailable(*args, **kwargs):
        raise tf.errors.UnavailableError(None, None, "Error executing an HTTP request: HTTP response code 503")

    monkeypatch.setattr(tf.io.gfile, "GFile", unavailable)
    result = run_command("plan_packing", f"--histogram={uri(os.path.join(unpacked_dir, 'histogram.json'))}")
    assert result.returncode == 75, result.stderr[-3000:]
    assert f"the storage failed a request on {uri(os.path.join(unpacked_dir, 'histogram.json'))}, retried (" \
           "UnavailableError: Error executing an HTTP request: HTTP response code 503)" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("reader", ["bert_config", "histogram", "huggingface_config", "throughput"])
def test_a_reader_called_from_python_raises_a_retryable_storage_failure_as_it_is(reader, tmp_path, monkeypatch):
    """From Python (no command line to find it under the reader's own refusal) a failure that
    retrying may get past comes out as the StorageError it is, retry_may_help set; a refusal of
    the same file stays the reader's one-line error."""
    from bert_packed.errors import StorageError
    from bert_packed.inputs.histogram_file import load_histogram
    from bert_packed.model import BertConfig
    from bert_packed.model.huggingface import require_same_model
    from bert_packed.reports.comparison import throughput_lines

    path = str(tmp_path / "config.json")
    (tmp_path / "config.json").write_text("{}")
    read = {"bert_config": lambda: BertConfig.from_json_file(path), "histogram": lambda: load_histogram(path),
            "huggingface_config": lambda: require_same_model(str(tmp_path), BertConfig()),
            "throughput": lambda: throughput_lines(path)}[reader]
    for retry_may_help in (True, False):
        def failing(name, *args, retry_may_help=retry_may_help, **kwargs):
            raise StorageError(name, "the bucket answered 503" if retry_may_help else "permission denied",
                               retry_may_help)

        monkeypatch.setattr(files, "open_file", failing)
        with pytest.raises(Exception) as raised:
            read()
        assert isinstance(raised.value, StorageError) == retry_may_help, raised.value
        assert ("the bucket answered 503" if retry_may_help else "permission denied") in str(raised.value)


def test_shards_the_local_work_says_are_written_but_the_bucket_lost_are_written_again(unpacked_dir, packed_dir,
                                                                                      tmp_path, monkeypatch):
    """A pack stopped after its first shard, its output prefix then emptied (as the messages
    suggest for a prefix that holds something else): the same command packs again, whole."""
    import shutil

    from bert_packed.packing import pack_dataset

    parts = [uri(os.path.join(unpacked_dir, name)) for name in contents(unpacked_dir)]
    out = tmp_path / "p"
    write = pack_dataset._write_bucket

    def stopped_at_the_second_shard(*args):
        if args[-1] == 1:
            raise KeyboardInterrupt
        write(*args)

    monkeypatch.setattr(pack_dataset, "_write_bucket", stopped_at_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        pack_pretraining_dataset(inputs_of(parts), uri(out), SETTINGS, num_workers=1)
    assert [name for name in os.listdir(out) if name.startswith("packed-")] == ["packed-00000-of-00002.tfrecord"]
    shutil.rmtree(out)
    monkeypatch.setattr(pack_dataset, "_write_bucket", write)
    metadata = pack_pretraining_dataset(inputs_of(parts), uri(out), SETTINGS, num_workers=1)
    assert contents(out) == contents(packed_dir)
    assert verify_packed_dataset(uri(out))["num_sequences"] == metadata["num_sequences"]


def test_what_a_bucket_s_storage_refuses_is_one_line_as_on_a_plain_path(unpacked_dir, corpus, tmp_path):
    from bert_packed.errors import SettingsError
    from bert_packed.training.config import RunConfig

    eval_file = str(tmp_path / "e.tfrecord")  # records of no dataset: no origin to refuse
    with open(eval_file, "wb") as f:
        f.write(open(os.path.join(unpacked_dir, "part-00000-000.tfrecord"), "rb").read())
    shapes = [f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}"]
    (tmp_path / "a file").write_text("x")
    (tmp_path / "locked" / ".lock").mkdir(parents=True)
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / ".lock").write_text(json.dumps({"host": __import__("socket").gethostname(), "pid": 1e999}))
    create = [f"--input_file={corpus[0]}", f"--vocab_file={VOCAB}", *shapes, "--dupe_factor=1", "--num_workers=1"]
    cases = [
        (["pick_eval_samples", f"--input_tfrecord={uri(tmp_path / 'none.tfrecord')}",
          f"--output_tfrecord={uri(tmp_path / 'o.tfrecord')}", *shapes], f"{uri(tmp_path / 'none.tfrecord')}"),
        (["pick_eval_samples", f"--input_tfrecord={uri(tmp_path)}", f"--output_tfrecord={uri(tmp_path / 'o.tfrecord')}",
          *shapes], "Is a directory"),
        (["pick_eval_samples", f"--input_tfrecord={eval_file}", f"--output_tfrecord={eval_file}", *shapes],
         "the input itself"),
        (["pick_eval_samples", f"--input_tfrecord={eval_file}",
          f"--output_tfrecord={os.path.join(unpacked_dir, 'picked.tfrecord')}", *shapes], "in a dataset's directory"),
        (["create_pretraining_data", *create, f"--output_dir={uri(tmp_path / 'a file' / 'sub')}"], "not a directory"),
        (["create_pretraining_data", *create, f"--output_dir={uri(tmp_path / 'locked')}"],
         "cannot be read; remove it"),
        (["create_pretraining_data", *create, f"--output_dir={tmp_path / 'held'}"], "pid inf on"),
    ]
    for args, words in cases:
        result = run_command(*args)
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr[-2000:])
        assert last.startswith(f"{args[0]}: error: ") and words in last, (args, last)
    with pytest.raises(SettingsError, match=r"TensorFlow cannot read a checkpoint whose remote path holds"):
        RunConfig(output_dir=uri(tmp_path / "run [1]"))
    # A pick killed while it wrote left its temporary file: the next pick of that output removes it,
    # and nothing else of the directory.
    (tmp_path / ".o.tfrecord.tmp-99999999").write_bytes(b"half")
    (tmp_path / ".notes.txt.tmp-99999999").write_bytes(b"someone else's")
    picked = run_command("pick_eval_samples", f"--input_tfrecord={eval_file}",
                         f"--output_tfrecord={uri(tmp_path / 'o.tfrecord')}", "--num_examples_to_pick=2", *shapes)
    assert picked.returncode == 0, picked.stderr[-2000:]
    assert sorted(name for name in os.listdir(tmp_path) if ".tmp-" in name) == [".notes.txt.tmp-99999999"]
    # From Python: the same records, byte for byte, and the count the command printed.
    from bert_packed.pretraining_data.eval_samples import PickSettings, pick_eval_samples

    total = pick_eval_samples(PickSettings(input_tfrecord=eval_file, output_tfrecord=str(tmp_path / "f.tfrecord"),
                                           num_examples_to_pick=2, max_seq_length=MAX_SEQ_LENGTH,
                                           max_predictions_per_seq=MAX_PREDICTIONS))
    assert f"picked 2 of {total:,} records" in picked.stdout and total > 2
    assert (tmp_path / "f.tfrecord").read_bytes() == (tmp_path / "o.tfrecord").read_bytes()


def script(name, *args):
    """scripts/<name>.py in a process of its own."""
    return subprocess.run([sys.executable, os.path.join("scripts", f"{name}.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # the commands for real: in processes of their own, create's spawned workers
def test_the_data_commands_take_uris_across_processes(corpus, tmp_path):
    out = tmp_path / "out dir"
    shapes = [f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}"]
    create = [f"--input_file={','.join(uri(path) for path in corpus)}", f"--vocab_file={uri(VOCAB)}", "--dupe_factor=2",
              *shapes]
    created = script("create_pretraining_data", *create, f"--output_dir={uri(out / 'u')}", "--num_workers=2",
                     "--eval_fraction=0.3")
    assert created.returncode == 0, created.stderr
    packed = script("pack_pretraining_data", f"--input_files={uri(out / 'u')}/part-*.tfrecord",
                    f"--output_dir={uri(out / 'p')}", "--max_sequences_per_pack=3", "--verify", *shapes)
    assert packed.returncode == 0, packed.stderr
    # The reference's spelling, the eval pick and the planner, in this process (as a process would).
    reference = run_command("create_pretraining_data", *create, f"--output_file={uri(out / 'ref.tfrecord')}")
    assert reference.returncode == 0, reference.stderr
    assert sorted(os.listdir(out)) == ["p", "ref.tfrecord", "u"]  # its work (ref.tfrecord.parts) removed
    picked = run_command("pick_eval_samples", f"--input_tfrecord={uri(out / 'u')}/eval-00000.tfrecord",
                         f"--output_tfrecord={uri(out / 'picked.tfrecord')}", "--num_examples_to_pick=2", *shapes)
    assert picked.returncode == 0, picked.stderr
    planned = run_command("plan_packing", f"--histogram={uri(out / 'u' / 'histogram.json')}", "--json")
    assert planned.returncode == 0, planned.stderr
    info = read_dataset_info(str(out / "p"))
    assert json.loads(planned.stdout)["num_packs"] == info.num_records
    assert info.num_sequences == read_dataset_info(str(out / "u")).num_sequences
    assert len(list(read_records(str(out / "picked.tfrecord")))) == 2


# Calls that reach the filesystem. The package makes them only in the storage room's files.py (which
# sends a path with a scheme through tf.io.gfile) and locks.py; os.path's string functions are free.
FILESYSTEM_CALLS = {"open", "os.open", "os.stat", "os.lstat", "os.listdir", "os.scandir", "os.walk", "os.makedirs",
                    "os.mkdir", "os.remove", "os.unlink", "os.rename", "os.replace", "os.rmdir", "os.link",
                    "os.symlink", "os.path.exists", "os.path.isdir", "os.path.isfile", "os.path.getsize",
                    "os.path.getmtime", "os.path.realpath", "glob.glob", "shutil"}
# Where another call is right: (file, call, why).
ALLOWED = {("bert_packed/cli/common.py", "os.open"): "stdout to os.devnull, not a user's path",
           ("bert_packed/inputs/input_files.py", "os.path.realpath"): "one spelling of a local path, for duplicates"}


def test_only_the_storage_room_touches_the_filesystem():
    found = []
    for root, _, names in os.walk(os.path.join(REPO, "bert_packed")):
        for name in names:
            path = os.path.relpath(os.path.join(root, name), REPO)
            if not name.endswith(".py") or path in ("bert_packed/storage/files.py", "bert_packed/storage/locks.py"):
                continue
            for node in ast.walk(ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read())):
                if isinstance(node, ast.Call):
                    called = ast.unparse(node.func)
                    if (called in FILESYSTEM_CALLS or called.split(".")[0] == "shutil") and \
                            (path, called) not in ALLOWED:
                        found.append(f"{path}:{node.lineno} {called}")
    assert not found, "\n".join(found)


def test_reading_weights_or_a_run_s_checkpoint_keeps_a_retryable_failure_as_it_is(tmp_path, monkeypatch):
    """Asking whether --init_checkpoint's weights hold the pooler (which decides the next-sentence
    loss) took any failure for "yes": one that retrying may get past is now raised as that
    StorageError (status 75) before any work; a refusal still says "yes", for loading to name.
    Reading a TF1 checkpoint's step or weights kept it under a CheckpointError (status 2)."""
    import tensorflow as tf
    from conftest import TINY

    from bert_packed.errors import StorageError, TrainingError
    from bert_packed.model import BertConfig, BertPretrainingModel, load_google_checkpoint
    from bert_packed.model.checkpoint import CheckpointError, checkpoint_step
    from bert_packed.model.huggingface import holds_pooler
    from bert_packed.training.checkpoints import Checkpoints

    model = BertPretrainingModel(BertConfig(**TINY))
    (tmp_path / "config.json").write_text("{}")  # a Hugging Face directory
    for retry_may_help in (True, False):
        def failing(name, *args, retry_may_help=retry_may_help, **kwargs):
            raise StorageError(name, "the bucket answered 503", retry_may_help)

        monkeypatch.setattr(files, "open_file", failing)
        if retry_may_help:
            with pytest.raises(StorageError, match="the bucket answered 503") as raised:
                holds_pooler(str(tmp_path))
            assert raised.value.retry_may_help
        else:
            assert holds_pooler(str(tmp_path)) is True
    checkpoint = str(tmp_path / "tf1" / "model.ckpt-5")  # a TF1 checkpoint's prefix
    for error in (tf.errors.UnavailableError, tf.errors.PermissionDeniedError):
        def unreadable(prefix, error=error):
            raise error(None, None, f"{prefix}; the bucket answered 503")

        monkeypatch.setattr(tf.train, "load_checkpoint", unreadable)
        if error is tf.errors.UnavailableError:
            for read in (holds_pooler, checkpoint_step, lambda path: load_google_checkpoint(model, path)):
                with pytest.raises(StorageError, match="the bucket answered 503") as raised:
                    read(checkpoint)
                assert raised.value.retry_may_help and raised.value.path == checkpoint
        else:  # a refusal: holds_pooler says yes, the step is the name's, loading names the checkpoint
            assert holds_pooler(checkpoint) is True and checkpoint_step(checkpoint) == 5
            with pytest.raises(CheckpointError, match="cannot read the checkpoint"):
                load_google_checkpoint(model, checkpoint)
    # A run's own checkpoint, read to resume or to evaluate: the same, under the run's refusal.
    run = Checkpoints(str(tmp_path / "run"), tf.train.Checkpoint(model=model), keep=1)
    for error, raised_as in ((tf.errors.UnavailableError, StorageError), (tf.errors.PermissionDeniedError, TrainingError)):
        def unreadable(self, path, error=error):
            raise error(None, None, f"{path}; the bucket answered 503")

        monkeypatch.setattr(tf.train.Checkpoint, "read", unreadable)
        with pytest.raises(raised_as, match="the bucket answered 503"):
            run.read(checkpoint, "use a new --output_dir")
