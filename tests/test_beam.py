"""The Beam pipelines (bert_packed/beam) write what the single-machine commands write, byte for
byte, on Beam's local FnApiRunner: in worker processes, after a failure, and from files with
no metadata.json (the reference's own); bad input is one line before anything runs."""

import filecmp
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import apache_beam
import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, REPO, VOCAB, inputs_of, run_command, tfrecords, write_corpus

from bert_packed.beam import pipelines
from bert_packed.cli import beam as cli_beam
from bert_packed.inputs.dataset_info import read_dataset_info
from bert_packed.pretraining_data import create_dataset as create_module
from bert_packed.storage import files, locks

SHAPES = [f"--max_seq_length={MAX_SEQ_LENGTH}", f"--max_predictions_per_seq={MAX_PREDICTIONS}"]
TWO_PROCESSES = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def beam(command, *args):
    single_machine = {"create": "create_pretraining_data", "pack": "pack_pretraining_data"}[command]
    return run_command(single_machine, command, *args, launcher="beam")


def same_files(first, second, but=("metadata.json",)):
    """The names in `first` and `second` (temporary and lock files aside) that differ in bytes."""
    names = sorted(n for n in set(os.listdir(first)) | set(os.listdir(second)) if not n.startswith("."))
    return [n for n in names if n not in but and not (os.path.exists(os.path.join(second, n))
                                                       and filecmp.cmp(os.path.join(first, n), os.path.join(second, n),
                                                                       shallow=False))]


def metadata_without_timings(directory):
    metadata = json.load(open(os.path.join(directory, "metadata.json")))
    metadata.pop("seconds", None)
    return metadata


@pytest.mark.slow
def test_two_worker_processes_write_the_single_machine_commands_output(tmp_path):
    corpus = write_corpus(str(tmp_path), num_files=3)
    with open(corpus[1], "a", encoding="utf-8") as f:  # a sentence longer than an instance, warned of
        f.write('<doc id="9" url="https://en.wikipedia.org/wiki?curid=9" title="Long">\nLong\n\n' + "the " * 300
                + "\n</doc>\n")
    create = [f"--input_file={','.join(corpus)}", f"--vocab_file={VOCAB}", *SHAPES, "--dupe_factor=2",
              "--eval_fraction=0.2", "--short_seq_prob=0.5", "--random_seed=7"]
    local = run_command("create_pretraining_data", *create, f"--output_dir={tmp_path / 'local'}", "--num_workers=1")
    assert local.returncode == 0
    result = beam("create", *create, f"--output_dir={tmp_path / 'beam'}", *TWO_PROCESSES)
    assert result.returncode == 0, result.stderr
    # The workers' warnings, as the single-machine command's own; Beam's lines left out.
    warnings = [line for line in local.stderr.splitlines() if line.startswith("warning:")]
    assert warnings and [line for line in result.stderr.splitlines() if line.startswith("warning:")] == warnings
    assert "Worker" not in result.stderr and "apache_beam" not in result.stderr
    assert "bert_packed.beam create: " in result.stdout and "held out for evaluation" in result.stdout
    assert same_files(tmp_path / "local", tmp_path / "beam", but=()) == []  # metadata.json too

    # The reference's own files: shards with no metadata.json beside them, of several files.
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in sorted(os.listdir(tmp_path / "beam")):
        if name.startswith("part-") and name.endswith(".tfrecord"):
            shutil.copy(tmp_path / "beam" / name, bare / name)
    assert len(os.listdir(bare)) == 6
    pack = [f"--input_files={bare}/part-*", *SHAPES, "--num_shards=3", "--seed=3"]
    assert run_command("pack_pretraining_data", *pack, f"--output_dir={tmp_path / 'packed_local'}",
                       "--num_workers=1").returncode == 0
    result = beam("pack", *pack, f"--output_dir={tmp_path / 'packed_beam'}", "--verify", *TWO_PROCESSES)
    assert result.returncode == 0, result.stderr
    assert ", verified ->" in result.stdout
    packed = sorted(n for n in os.listdir(tmp_path / "packed_beam") if n.startswith("packed-"))
    assert packed == [f"packed-0000{i}-of-00003.tfrecord" for i in range(3)]
    assert same_files(tmp_path / "packed_local", tmp_path / "packed_beam") == []
    assert metadata_without_timings(tmp_path / "packed_local") == metadata_without_timings(tmp_path / "packed_beam")
    assert not os.path.exists(tmp_path / "packed_beam" / ".work")


def _workers_of(pid):
    """The processes whose parent is `pid` and that run bert_packed.beam.worker."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as stat, open(f"/proc/{name}/cmdline") as cmdline:
                parent, command = int(stat.read().rsplit(")", 1)[1].split()[1]), cmdline.read()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == pid and "bert_packed.beam.worker" in command:
            found.append(int(name))
    return found


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_command_killed_with_kill_9_takes_its_worker_processes_with_it(tmp_path):
    """Beam's local workers ran on after a kill -9 of the command, writing, two more with every
    rerun: each now ends within about a second of the command, and the same command completes."""
    corpus = write_corpus(str(tmp_path), num_files=2)
    create = [f"--input_file={','.join(corpus)}", f"--vocab_file={VOCAB}", *SHAPES, "--dupe_factor=20",
              f"--output_dir={tmp_path / 'out'}", *TWO_PROCESSES]
    # Its workers' log file (bert_packed.cli.beam), which a kill -9 leaves, in tmp_path.
    driver = subprocess.Popen([sys.executable, "-m", "bert_packed.beam", "create", *create], cwd=REPO,
                              env={**os.environ, "TMPDIR": str(tmp_path)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(workers := _workers_of(driver.pid)) < 2 and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers) == 2, "the command's two worker processes did not start"
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 5
    while any(map(_running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if _running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "worker processes ran on after the command was killed"
    result = beam("create", *create)
    assert result.returncode == 0, result.stderr
    assert read_dataset_info(str(tmp_path / "out")).num_records > 0


def test_a_failed_pack_pipeline_commits_nothing_and_the_same_command_completes_it(unpacked_dir, tmp_path,
                                                                                  monkeypatch):
    pack = [f"--input_files={unpacked_dir}/part-*.tfrecord", "--num_shards=3", "--seed=5"]
    assert run_command("pack_pretraining_data", *pack, f"--output_dir={tmp_path / 'local'}").returncode == 0
    output = tmp_path / "beam"
    write_shard = pipelines.write_shard

    def fails_on_the_second_bucket(rows, output_dir, work, settings, num_packs, num_buckets, bucket):
        if bucket == 1:
            with files.storage(output_dir):  # as a write of the storage layer meets a full disk
                raise OSError(28, "No space left on device")
        return write_shard(rows, output_dir, work, settings, num_packs, num_buckets, bucket)

    monkeypatch.setattr(pipelines, "write_shard", fails_on_the_second_bucket)
    failed = beam("pack", *pack, f"--output_dir={output}")
    assert failed.returncode == 2 and "the disk is full" in failed.stderr.splitlines()[-1], failed.stderr
    assert not os.path.exists(output / "metadata.json") and read_dataset_info(str(output)) is None
    written = sorted(n for n in os.listdir(output) if n.startswith("packed-"))
    assert "packed-00001-of-00003.tfrecord" not in written and written  # the others may be written
    before = {name: os.stat(output / name).st_mtime_ns for name in written}

    monkeypatch.setattr(pipelines, "write_shard", write_shard)
    result = beam("pack", *pack, f"--output_dir={output}")
    assert result.returncode == 0, result.stderr
    assert {name: os.stat(output / name).st_mtime_ns for name in written} == before  # not written again
    assert same_files(tmp_path / "local", output) == []
    assert metadata_without_timings(tmp_path / "local") == metadata_without_timings(output)
    again = beam("pack", *pack, f"--output_dir={output}")
    assert again.returncode == 0 and "already made with these settings and inputs; nothing to do" in again.stderr
    os.remove(output / "packed-00002-of-00003.tfrecord")
    gone = beam("pack", *pack, f"--output_dir={output}")
    assert gone.returncode == 2 and gone.stderr.strip().endswith(
        f"{output / 'packed-00002-of-00003.tfrecord'}: gone (1 of the 4 files its metadata.json lists): the dataset "
        f"is no longer whole; remove {output} and run the same command again"), gone.stderr


def test_a_pipelines_lock_names_the_beam_command(unpacked_dir, tmp_path, monkeypatch):
    """The single-machine command started while a pipeline writes the same output is refused,
    naming the command that holds it as the user ran it."""
    pack = [f"--input_files={unpacked_dir}/part-*.tfrecord", "--num_shards=2"]
    output = tmp_path / "beam"
    write_shard, refusals = pipelines.write_shard, []

    def meanwhile(*args):
        if not refusals:
            with pytest.raises(locks.DirectoryLockedError) as refused:
                pipelines.pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(output), args[3])
            refusals.append(str(refused.value))
        return write_shard(*args)

    monkeypatch.setattr(pipelines, "write_shard", meanwhile)
    assert beam("pack", *pack, f"--output_dir={output}").returncode == 0
    assert refusals[0].startswith(f"{output}: in use by bert_packed.beam pack (pid {os.getpid()} on ")


def test_a_create_pipeline_resumes_the_shards_it_did_not_write(tmp_path, monkeypatch):
    corpus = write_corpus(str(tmp_path), num_files=2)
    create = [f"--input_file={','.join(corpus)}", f"--vocab_file={VOCAB}", *SHAPES, "--dupe_factor=2"]
    assert beam("create", *create, f"--output_dir={tmp_path / 'kept'}").returncode == 0
    run_pass = create_module._run_pass

    def fails_at_the_last_shard(file_index, dupe_pass, *args):
        if (file_index, dupe_pass) == (1, 1):
            with files.storage(str(tmp_path)):  # as a write of the storage layer meets a full disk
                raise OSError(28, "No space left on device")
        return run_pass(file_index, dupe_pass, *args)

    monkeypatch.setattr(create_module, "_run_pass", fails_at_the_last_shard)
    failed = beam("create", *create, f"--output_dir={tmp_path / 'beam'}")
    assert failed.returncode == 2 and not os.path.exists(tmp_path / "beam" / "metadata.json"), failed.stderr
    monkeypatch.setattr(create_module, "_run_pass", run_pass)
    result = beam("create", *create, f"--output_dir={tmp_path / 'beam'}")
    assert result.returncode == 0, result.stderr
    assert "resuming the unfinished run: 3 units of its work already done" in result.stderr, result.stderr
    assert same_files(tmp_path / "kept", tmp_path / "beam", but=()) == []


@pytest.mark.parametrize("args, message", [
    ([], "no command: give create or pack first"),
    (["split"], "unknown command 'split'"),
    (["pack", "--bogus=1"], "--bogus: neither a flag of this command nor a Beam pipeline option"),
    (["pack", "stray"], "'stray': neither a flag of this command nor a Beam pipeline option"),
    (["pack", "--num_workers=2"], "--num_workers=2 is a cluster runner's option"),
    (["pack", "--direct_num_workers=-1"], "--direct_num_workers must be >= 0"),
    (["pack", "--direct_running_mode=bogus"], "argument --direct_running_mode: invalid choice: 'bogus' (choose from"),
    (["pack", "--runner=NoSuchRunner"], "--runner=NoSuchRunner: Unexpected pipeline runner: NoSuchRunner. Valid"),
    # Beam asks the gcloud command for the project: a process started.
    pytest.param(["pack", "--runner=DataflowRunner"], "Missing GCS path option: temp_location. (and 3 more: ",
                 marks=pytest.mark.slow),
    (["create", "--output_file=x.tfrecord"], "--output_file: a pipeline writes a dataset directory"),
    (["pack", "--input_files=NOWHERE/part-*"], "--input_files: 'NOWHERE/part-*' matches no file"),
])
def test_bad_input_is_one_line_before_anything_runs(unpacked_dir, tmp_path, args, message):
    output = tmp_path / "out"
    inputs = {"pack": [f"--input_files={unpacked_dir}/part-*.tfrecord"],
              "create": [f"--input_file={os.path.join(REPO, 'data', 'wikipedia_sample', 'wiki_00')}"]}
    given = args[:1] + (inputs.get(args[0], []) if args and "--input_files" not in " ".join(args) else [])
    result = run_command("pack_pretraining_data" if args[:1] != ["create"] else "create_pretraining_data",
                         *given, *args[1:], f"--output_dir={output}", launcher="beam")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not output.exists()


def test_help_is_on_stdout_and_ends_on_a_newline():
    result = run_command("create_pretraining_data", "--help", launcher="beam")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("Data preparation on Apache Beam") and result.stdout.endswith("cluster commands.\n")


def test_without_beam_installed_the_command_says_what_to_install(unpacked_dir, tmp_path, monkeypatch):
    """make run installs the main job's needs only: Beam comes with make test or its extra."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "apache_beam"
                        else find_spec(name, *args))
    result = run_command("pack_pretraining_data", "pack", f"--input_files={unpacked_dir}/part-*.tfrecord",
                         f"--output_dir={tmp_path / 'out'}", launcher="beam")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["bert_packed.beam pack: error: Apache Beam is not installed: pip install "
                                                  "-e '.[beam]' in a clone (make test installs it too), or pip install "
                                                  "'bert-packed[beam]'"]
    assert not (tmp_path / "out").exists()


# Set when a test lets its stuck pipeline go on. The functions the pipelines run are the module's
# own, which Beam pickles by name: a closure's event would reach the pipeline as a copy.
RELEASE = threading.Event()


def interrupt_then_hang(element):
    os.kill(os.getpid(), signal.SIGINT)
    RELEASE.wait(60)  # as Beam waiting for a worker that never stops
    return element


def a_worker_dies(element):
    """As Beam's thread that watches a worker process the OOM killer killed: it ends alone, and the
    pipeline waits for that worker's answer forever."""
    threading.Thread(target=exec, args=("raise RuntimeError('Worker subprocess exited with return code 137')",),
                     name="run_worker").start()
    RELEASE.wait(60)
    return element


def wait_for_the_pipeline():
    """Lets a pipeline left running end (else a command run here later would not wait for it)."""
    RELEASE.set()
    for thread in threading.enumerate():
        if thread.name == pipelines.PIPELINE_THREAD:
            thread.join(60)
    assert not pipelines.pipeline_left_running()


def test_an_interrupt_stops_the_wait_for_the_pipeline_even_when_beam_is_stuck():
    # Interrupted while its workers start or stop, Beam waited for them forever: Ctrl-C now lands in
    # the main thread, which only waits, and the command exits (the pipeline's thread a daemon).
    RELEASE.clear()
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            pipelines._run(pipelines.pipeline_options([]),
                           lambda pipeline: pipeline | apache_beam.Create([1]) | apache_beam.Map(interrupt_then_hang))
        assert time.monotonic() - start < 30
    finally:
        signal.signal(signal.SIGINT, handler)
        wait_for_the_pipeline()


def test_a_failed_thread_of_the_runner_fails_the_run_instead_of_leaving_it_waiting():
    RELEASE.clear()
    excepthook = threading.excepthook
    start = time.monotonic()
    try:
        with pytest.raises(pipelines.RunnerError, match=r"the runner failed: RuntimeError: Worker subprocess exited "
                                                        r"with return code 137 \(a worker process killed"):
            pipelines._run(pipelines.pipeline_options([]),
                           lambda pipeline: pipeline | apache_beam.Create([1]) | apache_beam.Map(a_worker_dies))
        assert time.monotonic() - start < 30
        assert threading.excepthook is excepthook  # put back
    finally:
        wait_for_the_pipeline()


def test_a_workers_warning_is_shown_as_the_commands_own_and_beams_lines_are_left_out():
    from apache_beam.portability.api import beam_fn_api_pb2

    package = os.path.dirname(apache_beam.__file__)
    own_lines = cli_beam._OwnLines(package)

    def runner_line(message, location, level=logging.WARNING):
        """As Beam's runner logs what a worker process logged."""
        entry = str(beam_fn_api_pb2.LogEntry(message=message, log_location=location)).replace("\n", " ")
        return logging.LogRecord("beam", level, os.path.join(package, "runners", "local_job_service.py"), 367,
                                 "Worker: %s", (entry,), None)

    warning = runner_line("/data/a b.txt:377: a sentence of 4,836 characters is cut into 2 pieces of 100%",
                          "/repo/bert_packed/pretraining_data/corpus.py:260")
    assert own_lines.filter(warning)
    assert warning.getMessage() == "/data/a b.txt:377: a sentence of 4,836 characters is cut into 2 pieces of 100%"
    assert warning.msg == "%s: a sentence of %s characters is cut into %s pieces of %s%%"  # repeats counted as one kind
    assert not own_lines.filter(runner_line("No semi_persistent_directory found", f"{package}/sdk_worker_main.py:421"))
    assert not own_lines.filter(runner_line("Python sdk harness starting.", "/repo/bert_packed/x.py:1", logging.INFO))
    assert not own_lines.filter(logging.LogRecord("beam", logging.WARNING, f"{package}/x.py", 1, "Worker: %s",
                                                  ("not { a log entry",), None))
    assert own_lines.filter(logging.LogRecord("bert_packed", logging.INFO, "/repo/bert_packed/x.py", 1, "mine", (),
                                              None))


def test_a_corrupt_record_found_by_a_worker_is_one_line_naming_it(unpacked_dir, tmp_path):
    inputs = tmp_path / "inputs"
    shutil.copytree(unpacked_dir, inputs)
    name = sorted(n for n in os.listdir(inputs) if n.startswith("part-") and n.endswith(".tfrecord"))[1]
    data = bytearray((inputs / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (inputs / name).write_bytes(data)
    (inputs / "metadata.json").unlink()  # else the input's recorded head or size may name it first
    result = beam("pack", f"--input_files={inputs}/part-*.tfrecord", *SHAPES, f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bert_packed.beam pack: error: {inputs / name}: record ") and "corrupt" in last, last
    assert not (tmp_path / "out" / "metadata.json").exists()
