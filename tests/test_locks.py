"""One process at a time in an output directory: the lock, and every command started twice at once."""

import json
import multiprocessing
import os
import subprocess
import sys
import time
import warnings

import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, REPO, VOCAB, tfrecords

from bert_packed.inputs.dataset_info import read_dataset_info
from bert_packed.storage import files, locks


def hold(lock_path, log_path, barrier, rounds):
    """Takes the lock `rounds` times; logs when it held it (or that it was refused)."""
    for _ in range(rounds):
        barrier.wait()
        try:
            with locks.exclusive(lock_path, "test"):
                start = time.monotonic()
                time.sleep(0.01)
                end = time.monotonic()
            line = f"{start} {end}\n"
        except locks.DirectoryLockedError as e:
            assert "in use by test (pid " in str(e)
            line = "refused\n"
        with open(log_path, "a") as f:
            f.write(line)


@pytest.mark.slow
def test_processes_racing_for_the_lock_never_hold_it_together(tmp_path):
    lock, log = str(tmp_path / ".lock"), str(tmp_path / "log")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(6)
    processes = [context.Process(target=hold, args=(lock, log, barrier, 30)) for _ in range(6)]
    with warnings.catch_warnings():
        # JAX warns of every fork once a test before has run it in this process (test_update_program
        # does, when the two share a worker): the children only take a lock, touching neither JAX
        # nor TensorFlow.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        for process in processes:
            process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    lines = open(log).read().splitlines()
    held = sorted(tuple(map(float, line.split())) for line in lines if line != "refused")
    refused = lines.count("refused")
    assert len(held) + refused == 6 * 30 and len(held) >= 30  # every round somebody held it
    assert all(end <= next_start for (_, end), (next_start, _) in zip(held, held[1:]))  # never two at once
    assert not os.path.exists(lock)


@pytest.mark.slow
def test_a_lock_left_by_a_dead_process_is_taken_over_and_a_live_one_named(tmp_path):
    lock = str(tmp_path / ".lock")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with open(lock, "w") as f:
        json.dump({"command": "pack_pretraining_data", "host": os.uname().nodename, "pid": int(dead.stdout),
                   "started": "2026-11-23 10:00:00"}, f)
    with locks.exclusive(lock, "create_pretraining_data"):
        holder = json.load(open(lock))
        assert holder["pid"] == os.getpid() and holder["command"] == "create_pretraining_data"
        with pytest.raises(locks.DirectoryLockedError, match=rf"{tmp_path}: in use by create_pretraining_data "
                                                             rf"\(pid {os.getpid()} on .*, since .*\)"):
            with locks.exclusive(lock, "run_pretraining"):
                pass
    assert sorted(os.listdir(tmp_path)) == []
    # A live pid that is another process now (a container's pid 1 after a restart): stale too.
    with open(lock, "w") as f:
        json.dump({"command": "run_pretraining", "host": os.uname().nodename, "pid": os.getppid(),
                   "started": "2026-11-23 10:00:00", "process_start": "another boot:12"}, f)
    with locks.exclusive(lock, "create_pretraining_data"):
        assert json.load(open(lock))["pid"] == os.getpid()
    # A process killed but not reaped (a zombie; for good under a pid 1 that reaps nothing): stale.
    zombie = subprocess.Popen(["sleep", "0.3"])
    started = files._process_start(zombie.pid)
    time.sleep(1.0)
    with open(lock, "w") as f:
        json.dump({"command": "run_pretraining", "host": os.uname().nodename, "pid": zombie.pid,
                   "started": "2026-11-23 10:00:00", "process_start": started}, f)
    with locks.exclusive(lock, "create_pretraining_data"):
        assert json.load(open(lock))["pid"] == os.getpid()
    zombie.wait()
    # Another machine's: it cannot be told, so it holds, and the message says how to take it back.
    with open(lock, "w") as f:
        json.dump({"command": "run_pretraining", "host": "node-7", "pid": 1, "started": "2026-11-23 10:00:00"}, f)
    with pytest.raises(locks.DirectoryLockedError, match=rf"pid 1 on node-7, .*if that process no longer runs, "
                                                         rf".*remove {lock}\)$"):
        with locks.exclusive(lock, "run_pretraining"):
            pass
    os.remove(lock)
    (tmp_path / ".lock").write_text("{garbage")
    with pytest.raises(locks.DirectoryLockedError, match="cannot be read; remove it if no process uses"):
        with locks.exclusive(lock, "run_pretraining"):
            pass


def test_a_taker_of_a_stale_lock_leaves_alone_the_lock_another_took_meanwhile(tmp_path, monkeypatch):
    """Two processes that both found a dead holder: the one second to the takeover finds the lock
    already the first's (live) and leaves it, then is refused by it; a lock released between
    "it exists" and "who holds it" is tried again, never taken as stale."""
    lock = str(tmp_path / ".lock")
    dead = {"command": "run_pretraining", "host": os.uname().nodename, "pid": 2**22 + 1, "started": "then"}
    taken = {"command": "run_pretraining", **files.this_process(), "started": "now", "claim": "first"}
    with open(lock, "w") as f:
        json.dump(taken, f)  # the first taker's, written after both read `dead`
    locks._remove_stale(lock, dead)
    assert json.load(open(lock)) == taken
    os.remove(lock)
    with open(lock, "w") as f:
        json.dump(dead, f)
    locks._remove_stale(lock, dead)
    assert not os.path.exists(lock)
    reads = [{}]  # released just after the link failed (then taken again): the next try is refused
    real = locks._lock_holder
    monkeypatch.setattr(locks, "_lock_holder", lambda path: reads.pop() if reads else real(path))
    with open(lock, "w") as f:
        json.dump(taken, f)
    monkeypatch.setattr(locks, "_remove_stale", lambda *_: pytest.fail("a released lock was taken as stale"))
    with pytest.raises(locks.DirectoryLockedError, match="in use by run_pretraining"):
        with locks.exclusive(lock, "create_pretraining_data"):
            pass


def start(script, *args):
    return subprocess.Popen([sys.executable, os.path.join(REPO, script), *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def race(script, args, offset):
    """Two processes of one command, the second `offset` seconds after the first."""
    first = start(script, *args)
    time.sleep(offset)
    second = start(script, *args)
    results = [(process.wait(600), process.communicate()[1]) for process in (first, second)]
    for status, stderr in results:
        assert status == 0 or (status == 2 and "in use by" in stderr.strip().splitlines()[-1]
                               and "Traceback" not in stderr), stderr[-3000:]
    return [status for status, _ in results]


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0.0, 0.3, 1.0])
def test_two_packers_at_once_publish_one_complete_dataset(unpacked_dir, packed_dir, tmp_path, offset):
    out = tmp_path / "packed"
    race("scripts/pack_pretraining_data.py", [f"--input_files={unpacked_dir}/part-*.tfrecord", f"--output_dir={out}",
                                              f"--max_seq_length={MAX_SEQ_LENGTH}",
                                              f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--num_shards=2",
                                              "--algorithm=lp", "--num_workers=1"], offset)
    assert read_dataset_info(str(out)).checksum == read_dataset_info(packed_dir).checksum
    assert [open(a, "rb").read() for a in tfrecords(str(out))] == [open(b, "rb").read() for b in tfrecords(packed_dir)]
    assert not (out / ".work").exists() and not (out / ".lock").exists()


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0.0, 0.5])
def test_two_creators_at_once_write_one_dataset(corpus, unpacked_dir, tmp_path, offset):
    out = tmp_path / "unpacked"
    race("scripts/create_pretraining_data.py", [f"--input_file={','.join(corpus)}", f"--output_dir={out}",
                                                f"--vocab_file={VOCAB}", f"--max_seq_length={MAX_SEQ_LENGTH}",
                                                f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--dupe_factor=2",
                                                "--short_seq_prob=0.5", "--num_workers=1"], offset)
    assert [open(a, "rb").read() for a in tfrecords(str(out))] == [open(b, "rb").read() for b in tfrecords(unpacked_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0.0, 2.0])
def test_two_trainers_on_one_output_dir_never_interleave(packed_dir, bert_config_file, tmp_path, offset):
    out = tmp_path / "run"
    statuses = race("run_pretraining.py", [f"--bert_config_file={bert_config_file}",
                                           f"--input_file={packed_dir}/packed-*.tfrecord", f"--output_dir={out}",
                                           f"--max_seq_length={MAX_SEQ_LENGTH}",
                                           f"--max_predictions_per_seq={MAX_PREDICTIONS}", "--train_batch_size=4",
                                           "--num_train_steps=3", "--deterministic"], offset)
    log = [json.loads(line) for line in open(out / "train_log.jsonl")]
    assert [r["step"] for r in log] == [1, 2, 3]  # one run's lines, none lost or doubled
    assert 2 in statuses or statuses == [0, 0]  # refused, or started after the first had finished
