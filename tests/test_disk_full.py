"""A disk that fills up: each command stops with one line, keeps what it finished, and the same
command completes the job once there is room.

The disk fills for real, from the kernel's side: the command runs under a file-size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored), so a write past the limit fails with EFBIG at whatever point
the command has reached, as ENOSPC would on a full disk.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, REPO, VOCAB, tfrecords, write_corpus

from bert_packed.inputs.dataset_info import read_dataset_info

pytestmark = pytest.mark.slow  # every test here runs a command in a subprocess


def run(script, *args, file_size_limit=None):
    """Runs a script of the repository, under a file-size limit when given."""
    code = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    if file_size_limit:
        code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({file_size_limit}, {file_size_limit})); " + code)
    return subprocess.run([sys.executable, "-c", code, os.path.join(REPO, script), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO)


def assert_stopped_cleanly(result, directory):
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "the disk is full (File too large)" in last and "run the same command again" in last, last
    assert "Traceback" not in result.stderr
    leftovers = [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names
                 if ".tmp-" in name]
    assert leftovers == []  # nothing half-written under a temporary name
    return last


def files_and_times(directory):
    return {name: os.path.getmtime(os.path.join(directory, name)) for name in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, name))}


def test_create_pretraining_data_keeps_finished_shards_and_completes_later(tmp_path):
    (tmp_path / "small").mkdir()
    (tmp_path / "large").mkdir()
    small = write_corpus(str(tmp_path / "small"), num_files=1, docs_per_file=2)
    large = write_corpus(str(tmp_path / "large"), num_files=1, docs_per_file=12)
    corpus = [small[0], large[0]]
    flags = [f"--input_file={','.join(corpus)}", f"--vocab_file={VOCAB}", f"--max_seq_length={MAX_SEQ_LENGTH}",
             f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--dupe_factor=1", "--num_workers=1"]
    clean = run("scripts/create_pretraining_data.py", *flags, f"--output_dir={tmp_path / 'clean'}")
    assert clean.returncode == 0, clean.stderr[-3000:]
    sizes = sorted(os.path.getsize(path) for path in tfrecords(str(tmp_path / "clean")))
    assert sizes[0] < sizes[-1]

    out = tmp_path / "out"
    limit = (sizes[0] + sizes[-1]) // 2  # the small file's shard fits, the large one's does not
    last = assert_stopped_cleanly(run("scripts/create_pretraining_data.py", *flags, f"--output_dir={out}",
                                      file_size_limit=limit), out)
    assert "Finished shards are kept" in last
    kept = files_and_times(out)
    assert [name for name in kept if name.endswith(".tfrecord")] == ["part-00000-000.tfrecord"]
    assert "metadata.json" not in kept  # nothing looks finished

    again = run("scripts/create_pretraining_data.py", *flags, f"--output_dir={out}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert os.path.getmtime(out / "part-00000-000.tfrecord") == kept["part-00000-000.tfrecord"]  # not redone
    for a, b in zip(tfrecords(str(out)), tfrecords(str(tmp_path / "clean")), strict=True):
        assert open(a, "rb").read() == open(b, "rb").read()
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "clean"))  # and nothing else


def test_pack_pretraining_data_keeps_its_first_pass_and_completes_later(unpacked_dir, packed_dir, tmp_path):
    flags = [f"--input_files={','.join(tfrecords(unpacked_dir))}", f"--max_seq_length={MAX_SEQ_LENGTH}",
             f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--max_sequences_per_pack=3", "--algorithm=lp",
             "--num_shards=2", f"--output_dir={tmp_path}"]
    last = assert_stopped_cleanly(run("scripts/pack_pretraining_data.py", *flags, file_size_limit=16_384), tmp_path)
    assert str(tmp_path) in last and "Finished passes and shards are kept" in last
    assert not os.path.exists(tmp_path / "metadata.json")
    first_pass = files_and_times(tmp_path / ".work")
    assert [name for name in first_pass if name.startswith("input-")] == [
        f"input-{i:05d}.json" for i in range(len(tfrecords(unpacked_dir)))]

    again = run("scripts/pack_pretraining_data.py", *flags, "--verify")
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_dataset_info(str(tmp_path)).checksum == read_dataset_info(packed_dir).checksum
    for a, b in zip(tfrecords(str(tmp_path)), tfrecords(packed_dir), strict=True):
        assert open(a, "rb").read() == open(b, "rb").read()  # as if the disk had never filled
    assert sorted(os.listdir(tmp_path)) == sorted(os.listdir(packed_dir))  # and nothing else: no .work


def test_run_pretraining_keeps_its_last_checkpoint_and_resumes_from_it(packed_dir, bert_config_file, tmp_path):
    out = tmp_path / "run"
    flags = [f"--bert_config_file={bert_config_file}", f"--input_files={packed_dir}/packed-*.tfrecord",
             f"--output_dir={out}", f"--max_seq_length={MAX_SEQ_LENGTH}",
             f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--max_sequences_per_pack=3", "--train_batch_size=4",
             "--save_checkpoints_steps=2", "--eval_every_samples=0", "--deterministic", "--log_every_steps=1"]
    first = run("run_pretraining.py", *flags, "--num_train_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = files_and_times(out / "checkpoints")

    # The next checkpoint does not fit: its data file (the weights and LAMB slots, as large as
    # the first's) may be half as large.
    data = max(os.path.getsize(out / "checkpoints" / name) for name in checkpoint)
    last = assert_stopped_cleanly(run("run_pretraining.py", *flags, "--num_train_steps=4",
                                      file_size_limit=data // 2), out)
    assert "The last complete checkpoint and the logs up to it are kept" in last
    assert files_and_times(out / "checkpoints") == checkpoint  # the last one, untouched
    assert not any("_temp" in name for name in os.listdir(out / "checkpoints"))

    again = run("run_pretraining.py", *flags, "--num_train_steps=4")
    assert again.returncode == 0, again.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in open(out / "train_log.jsonl")]
    assert steps == [1, 2, 3, 4]  # resumed from step 2; the steps redone are logged once
    assert not os.path.exists(out / "checkpoints" / ".saving")
    keys = [json.loads(line.split(":::MLLOG ", 1)[1])["key"] for line in open(out / "mllog.txt")]
    assert keys.count("init_start") == keys.count("run_start") == keys.count("run_stop") == 1  # nothing repeated
    assert keys[-1] == "run_stop" and keys.count("block_start") == keys.count("block_stop")
