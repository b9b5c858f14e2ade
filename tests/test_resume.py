"""A run stopped anywhere and started again with the same command ends as the uninterrupted run:
the same weights, train and eval logs and MLPerf log (which passes the compliance checker), and
nothing left over, on one device or several replicas per input pipeline."""

import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, TINY, inputs_of, tfrecords
from training_runs import config, make_trainer, read_log, trained, weights

from bert_packed.storage import files
from bert_packed.storage.run_directory import MLLOG
from bert_packed.training import logs as run_logs
from bert_packed.training import mlperf_log

# Timing fields differ between any two runs.
CLOCKS = ("seconds", "train_seconds", "time_ms", "file", "lineno")


class Killed(BaseException):
    """A kill -9, simulated in the process: no handler catches it."""


@contextlib.contextmanager
def killed_at(event: int | None, monkeypatch, kind: str | None = None):
    """Counts the writes a run makes (a file renamed into place, a log line) and, at the
    `event`-th (of `kind`, when given), stops as a kill would: before a rename, or halfway through
    a log line (torn).

    Yields:
      The list of events seen (their kinds), for counting.
    """
    seen = []
    move, append, emit = files.move, run_logs.RunLogs._append, mlperf_log._LineHandler.emit

    def count(name):
        seen.append(name)
        return (len(seen) if kind is None else seen.count(kind)) == event and name == (kind or name)

    def killed_move(source, destination):
        if count(f"move {os.path.basename(destination)}"):
            raise Killed
        move(source, destination)

    def killed_append(file, record):
        if count("log line"):
            file.write(json.dumps(record)[:20])
            file.flush()
            raise Killed
        append(file, record)

    def killed_emit(handler, record):
        if count("mllog line"):
            handler.file.write(record.getMessage()[:30])
            handler.file.flush()
            raise Killed
        emit(handler, record)

    monkeypatch.setattr(files, "move", killed_move)
    monkeypatch.setattr(run_logs.RunLogs, "_append", staticmethod(killed_append))
    monkeypatch.setattr(mlperf_log._LineHandler, "emit", killed_emit)
    yield seen


def what_a_run_leaves(directory):
    """Its logs without clocks, its MLPerf events without clocks, and the files it holds."""
    def log(name):
        path = os.path.join(directory, name)
        return [{k: v for k, v in json.loads(line).items() if k not in CLOCKS} for line in open(path)]

    events = []
    for line in open(os.path.join(directory, MLLOG)):
        event = json.loads(line.split(":::MLLOG ", 1)[1])
        event["metadata"] = {k: v for k, v in event["metadata"].items() if k not in CLOCKS}
        events.append({k: v for k, v in event.items() if k not in CLOCKS})
    held = sorted(os.path.relpath(os.path.join(root, name), directory) for root, _, names in os.walk(directory)
                  for name in names if "tensorboard" not in root)
    return {"train": log("train_log.jsonl"), "eval": log("eval_log.jsonl"), "mllog": events, "files": held}


def passes_the_compliance_checker(path) -> bool:
    from mlperf_logging.compliance_checker import mlp_compliance

    checker = mlp_compliance.make_checker("training", "5.0.0", True, True)
    return checker.check_file(str(path), "training_5.0.0/common.yaml")


SETTINGS = dict(num_train_steps=12, steps_per_update=2, iterations_per_loop=4, save_checkpoints_steps=8,
                eval_every_samples=15, target_mlm_accuracy=1.0, submission_division="open",
                log_every_steps=100)


@pytest.fixture(scope="module")
def uninterrupted(packed_dir, unpacked_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    trainer = make_trainer(config(directory, tfrecords(packed_dir), eval_files=tuple(tfrecords(unpacked_dir)),
                                  **SETTINGS))
    with pytest.MonkeyPatch.context() as monkeypatch, killed_at(None, monkeypatch) as seen:
        trainer.train()
    return what_a_run_leaves(directory), weights(trainer), seen


@pytest.mark.slow  # trains the uninterrupted run (over 3.5 s here)
def test_the_uninterrupted_run_is_what_the_others_are_held_to(uninterrupted):
    left, _, seen = uninterrupted
    assert [r["step"] for r in left["train"]] == [2, 4, 6, 8, 10, 12]
    assert [r["step"] for r in left["eval"]] == [4, 8, 12]
    assert "checkpoints/ckpt-8.index" in left["files"] and "checkpoints/ckpt-12.index" in left["files"]
    assert seen.count("log line") == 6 + len(left["eval"]) and seen.count("mllog line") == len(left["mllog"])


# Where the kills fall, by the kind of write (the nth of its kind, -1 the last): the first train
# line, before any checkpoint; a checkpoint's data moved in but not its index; the train line after
# the first checkpoint, torn; the last evaluation's MLPerf events; the last checkpoint's state file;
# the exported weights; run_stop; and `finished` in run.json.
KILLS = [
    ("log line", 1), ("move ckpt-8.index", 1), ("log line", 7), ("mllog line", -2), ("move checkpoint", 2),
    ("move model.ckpt-12.index", 1), ("mllog line", -1), ("move run.json", -1),
]


@pytest.mark.slow  # trains a run killed at a write and resumes it, for each write kind (over 3.5 s here)
@pytest.mark.parametrize("kind, nth", KILLS)
def test_a_kill_at_any_write_and_the_same_command_end_as_the_uninterrupted_run(packed_dir, unpacked_dir, tmp_path,
                                                                               uninterrupted, kind, nth, monkeypatch):
    left, final_weights, seen = uninterrupted
    events = [i for i, name in enumerate(seen, 1) if name == kind]
    event = events[nth - 1] if nth > 0 else events[nth]
    settings = dict(eval_files=tuple(tfrecords(unpacked_dir)), **SETTINGS)
    with pytest.MonkeyPatch.context() as patch, killed_at(event, patch), pytest.raises(Killed):
        trained(config(tmp_path, tfrecords(packed_dir), **settings))
    resumed = make_trainer(config(tmp_path, tfrecords(packed_dir), **settings))
    resumed.train()
    again = what_a_run_leaves(tmp_path)
    for part in ("train", "eval", "mllog", "files"):
        assert again[part] == left[part], part
    for mine, theirs in zip(weights(resumed), final_weights):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
    assert passes_the_compliance_checker(tmp_path / MLLOG)


SEVERAL_REPLICAS = r"""
import json, os, signal, sys
import numpy as np, tensorflow as tf
out, devices, modes, packed, unpacked, tests = sys.argv[1:]
devices = int(devices)
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
sys.path.insert(0, tests)
from training_runs import config, make_trainer, read_log, release, weights
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(devices)])
results = {}
for mode in modes.split(","):
    settings = dict(input_mode=mode, train_batch_size=8, steps_per_update=2, iterations_per_loop=2,
                    num_train_steps=8, bucket_boundaries=(64,) if mode == "bucketed" else ())
    data = (packed if mode == "packed" else unpacked).split(",")
    straight = make_trainer(config(f"{out}/{mode}-straight", data, **settings), strategy)
    straight.train()
    straight_weights = weights(straight)
    # Its compiled step, put back as new, is the stopped run's: compiling one for several replicas
    # is what costs, and the uninterrupted run has ended (as in a process of its own).
    release()
    stopped = make_trainer(config(f"{out}/{mode}-resumed", data, **settings), strategy)
    loop = stopped.update.loop

    def loop_then_sigterm(iterator, num_updates, loop=loop):
        result = loop(iterator, num_updates)
        os.kill(os.getpid(), signal.SIGTERM)  # preempted during the first compiled loop
        return result

    stopped.update.loop = loop_then_sigterm
    stopped.train()
    assert stopped.stopped_by == "SIGTERM" and int(stopped.step.numpy()) == 2
    # The same command again, as far as the data goes: restored from the checkpoint, a new input
    # pipeline that skips what the replicas took (the compiled update is reused: it is not what
    # is tested, and compiling it for several replicas is what costs).
    stopped.update.loop, stopped.stopped_by = loop, None
    stopped.train()
    logs = [read_log(f"{out}/{mode}-{run}/train_log.jsonl") for run in ("straight", "resumed")]
    results[mode] = {
        "steps": [[r["step"] for r in log] for log in logs],
        "losses": [[r["loss"] for r in log] for log in logs],
        "sequences": [[r["sequences"] for r in log] for log in logs],
        "weights": max(float(np.abs(a - b).max()) for a, b in zip(straight_weights, weights(stopped))),
        "replicas": strategy.num_replicas_in_sync,
    }
print(json.dumps(results))
"""


@pytest.mark.slow
def test_several_replicas_per_input_pipeline_resume_exactly(packed_dir, unpacked_dir, tmp_path):
    """One input pipeline feeds every replica of a MirroredStrategy (the 8 GPUs of a host): a
    resumed run skips the batches every replica took, in padded, bucketed and packed modes, on 2
    and on 4 replicas."""
    data = [",".join(tfrecords(packed_dir)), ",".join(tfrecords(unpacked_dir)), os.path.dirname(__file__)]
    processes = {devices: subprocess.Popen([sys.executable, "-c", SEVERAL_REPLICAS, str(tmp_path / str(devices)),
                                            str(devices), modes, *data], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, cwd=REPO)
                 for devices, modes in ((2, "padded,bucketed"), (4, "packed"))}
    for devices, process in processes.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        results = json.loads(stdout.strip().splitlines()[-1])
        for mode, run in results.items():
            straight, resumed = run["steps"]
            assert straight == resumed == [2, 4, 6, 8], mode
            assert run["losses"][0] == run["losses"][1], mode
            assert run["sequences"][0] == run["sequences"][1], mode
            assert run["weights"] == 0.0, mode
            assert run["replicas"] == devices
        assert set(results) == ({"padded", "bucketed"} if devices == 2 else {"packed"})


def run_command(out, *extra):
    """run_pretraining.py on the test data, as a process."""
    return [sys.executable, os.path.join(REPO, "run_pretraining.py"), f"--output_dir={out}", "--max_seq_length=128",
            "--max_predictions_per_seq=20", "--train_batch_size=4", "--steps_per_update=2", "--iterations_per_loop=4",
            "--num_train_steps=12", "--save_checkpoints_steps=4", "--eval_every_samples=15", "--deterministic",
            "--submission_division=open", "--target_mlm_accuracy=1.0", *extra]


def kill_when(process, path, lines, delay):
    """SIGKILLs `process` `delay` seconds after `path` holds `lines` lines (or when it ends)."""
    import time

    deadline = time.time() + 300
    while process.poll() is None and time.time() < deadline:
        if os.path.exists(path) and open(path, "rb").read().count(b"\n") >= lines:
            time.sleep(delay)
            break
        time.sleep(0.05)
    process.kill()
    process.wait()


@pytest.mark.slow
def test_kill_9_at_random_moments_then_the_same_command(packed_dir, other_text_dir, bert_config_file, tmp_path):
    """kill -9 twice, at moments drawn at random after a few log lines, then the same command:
    the run ends with the weights and logs of the uninterrupted one, and its mllog.txt passes.
    The killed run names every path by a file:// URI: through tf.io.gfile, as on a bucket."""
    import random

    from bert_packed.model import BertConfig, BertPretrainingModel, load_google_checkpoint

    data = [f"--bert_config_file={bert_config_file}", f"--input_files={packed_dir}/packed-*.tfrecord",
            f"--eval_files={other_text_dir}/part-*.tfrecord"]
    straight = subprocess.run(run_command(tmp_path / "straight", *data), capture_output=True, text=True, timeout=600,
                              cwd=REPO)
    assert straight.returncode == 0, straight.stderr[-3000:]
    draw = random.Random(os.getpid())
    out = tmp_path / "killed"
    remote = [f"--bert_config_file=file://{bert_config_file}", f"--input_files=file://{packed_dir}/packed-*.tfrecord",
              f"--eval_files=file://{other_text_dir}/part-*.tfrecord"]
    for lines in sorted(draw.sample(range(1, 9), 2)):  # of 40: later, a kill can come after the end
        process = subprocess.Popen(run_command(f"file://{out}", *remote), cwd=REPO, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        kill_when(process, out / "mllog.txt", 20 + lines, draw.uniform(0.0, 0.3))
    assert "finished" not in json.loads((out / "run.json").read_text())  # the kills came before the end
    finished = subprocess.run(run_command(f"file://{out}", *remote), capture_output=True, text=True, timeout=600,
                              cwd=REPO)
    assert finished.returncode == 0, finished.stderr[-3000:]
    left, expected = what_a_run_leaves(out), what_a_run_leaves(tmp_path / "straight")
    for part in ("train", "eval", "mllog", "files"):
        assert left[part] == expected[part], part
    assert passes_the_compliance_checker(out / MLLOG)
    models = []
    for run in (out, tmp_path / "straight"):
        model = BertPretrainingModel(BertConfig.from_json_file(bert_config_file))
        load_google_checkpoint(model, str(run / "model.ckpt-12"))
        models.append(model)
    for mine, theirs in zip(*[weights_of(model) for model in models]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)


def weights_of(model):
    return [w.numpy() for w in model.weights]


def coordination_errors(stderr):
    """The lines of a worker's stderr that say it outlived the coordination service in the chief's
    process (TensorFlow's "E0000 ... StartAbort UNAVAILABLE: Failed to send RPC to coordination
    service"): the workers did not leave together."""
    return [line for line in stderr.splitlines() if line.startswith("E0000") or "StartAbort" in line
            or "coordination service" in line]


def assert_the_workers_agree(run, packed_dir, eval_file, tmp_path):
    """Both workers of `run` hold the same weights, optimizer state and counters at step 20, and
    their evaluation together equals one process's of that checkpoint."""
    import tensorflow as tf

    chief = tf.train.load_checkpoint(str(run / "checkpoints" / "ckpt-20"))
    other = tf.train.load_checkpoint(str(run / ".workers" / "worker-1" / "checkpoints" / "ckpt-20"))
    # The logs' sizes are each worker's own (their clocks differ); everything else is shared.
    names = [n for n in chief.get_variable_to_shape_map() if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
             and not n.startswith("log_sizes")]
    # Weights (reached through the optimizer), their slots and the counters.
    assert {"model", "optimizer", "step", "sequences"} <= {n.split("/")[0] for n in names}
    assert len([n for n in names if n.startswith("optimizer/")]) > 2 * (5 + 16 * TINY["num_hidden_layers"])  # m, v
    for name in names:
        np.testing.assert_array_equal(chief.get_tensor(name), other.get_tensor(name))
    together = read_log(run / "eval_log.jsonl")[-1]
    single = make_trainer(config(tmp_path / "single", tfrecords(packed_dir), eval_files=(eval_file,), eval_batch_size=6))
    # read, not restore: restore adds a save_counter to this step's Checkpoint, and the step is
    # handed out again (tests/training_runs.py): a later test's checkpoint, written by another step
    # of the shape, would not fit it.
    single.compiled.state.read(str(run / "checkpoints" / "ckpt-20")).expect_partial()
    alone = single.evaluate()
    assert together["num_sequences"] == alone["num_sequences"] == sum(1 for _ in tf.data.TFRecordDataset(eval_file))
    for key in ("loss", "mlm_accuracy", "nsp_accuracy"):
        assert together[key] == pytest.approx(alone[key], rel=1e-5), key


def two_workers(out, flags, slurm=False):
    """Two run_pretraining processes on this host, a cluster of two workers: two tasks of a Slurm
    job step as srun starts them (ports --slurm_port_base and the next), or TF_CONFIG's."""
    from test_launch import free_port_pair, slurm_step
    from test_trainer import free_ports

    own = {name: value for name, value in os.environ.items() if not name.startswith("SLURM") and name != "TF_CONFIG"}
    if slurm:
        flags = [*flags, f"--slurm_port_base={free_port_pair()}"]
        launched = [slurm_step(rank, "localhost", "2", 2, "localhost", SLURM_LOCALID=str(rank), SLURM_NODEID="0")
                    for rank in range(2)]
    else:
        cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
        launched = [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
                    for index in range(2)]
    return [subprocess.Popen(run_command(out, *flags), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env={**own, **variables})
            for variables in launched]


def finish_quietly(processes):
    """Waits for each worker: it exits 0 and says little."""
    for process in processes:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        assert not coordination_errors(stderr), stderr
        # tf.distribute's own INFO lines ("Collective all_reduce tensors: ...", one an update) stay out.
        assert not [line for line in stderr.splitlines() if "Collective" in line or "Strategy" in line], stderr
        assert "retracing" not in stderr  # the workers' collectives for deciding together are compiled once
        assert len(stderr.splitlines()) <= 12, stderr


@pytest.mark.slow
def test_two_local_workers_train_together_and_killed_together_resume_together(packed_dir, other_text_dir,
                                                                             bert_config_file, tmp_path):
    """Two workers under multi_worker_mirrored train together: they hold the same weights, say
    little, leave together (no worker outlives the chief's coordination service), and evaluate an
    eval file together (each a share of its records) to the single-process figure. Both killed -9
    after their second checkpoint, one before its last save completed, and started again, they
    agree on a step both can restore, and the chief's logs and every worker's weights are the
    uninterrupted pair's. The uninterrupted pair are two tasks of a Slurm job step on one host, as
    srun starts them (SLURM_PROCID 0 and 1, the host's 2 tasks in SLURM_STEP_TASKS_PER_NODE), on
    ports --slurm_port_base and the next; the killed pair take their cluster from TF_CONFIG."""
    import tensorflow as tf

    eval_file = tfrecords(other_text_dir)[0]
    # 20 micro-steps: the kill, at the second checkpoint, comes well before the end.
    data = [f"--bert_config_file={bert_config_file}", f"--input_files={packed_dir}/packed-*.tfrecord",
            "--distribution_strategy=multi_worker_mirrored", "--all_reduce_alg=ring", "--num_train_steps=20",
            f"--eval_files={eval_file}", "--eval_every_samples=0", "--eval_batch_size=6"]  # one evaluation, at the end

    straight = tmp_path / "straight"
    finish_quietly(two_workers(straight, data, slurm=True))
    assert (straight / ".workers" / "worker-1" / "checkpoints").is_dir()  # task 1 is a worker of the chief's cluster
    assert_the_workers_agree(straight, packed_dir, eval_file, tmp_path)

    killed = two_workers(tmp_path / "killed", data)
    other = tmp_path / "killed" / ".workers" / "worker-1" / "checkpoints"
    # Killed once worker 1 holds two checkpoints (however slow the machine), so an older one is left.
    kill_when(killed[1], other / "ckpt-8.index", 0, 0)
    killed[0].kill()
    killed[0].wait()
    assert "finished" not in json.loads((tmp_path / "killed" / "run.json").read_text())
    # Worker 1 was killed before its newest save completed: the workers must agree on an older step.
    newest = max(int(p.name[len("ckpt-"):-len(".index")]) for p in other.glob("ckpt-*.index"))
    (other / f"ckpt-{newest}.index").unlink()
    finish_quietly(two_workers(tmp_path / "killed", data))
    left, expected = what_a_run_leaves(tmp_path / "killed"), what_a_run_leaves(straight)
    for part in ("train", "eval", "mllog", "files"):
        assert left[part] == expected[part], part
    for worker in ("", ".workers/worker-1/"):
        mine = tf.train.load_checkpoint(str(tmp_path / "killed" / f"{worker}checkpoints" / "ckpt-20"))
        theirs = tf.train.load_checkpoint(str(straight / f"{worker}checkpoints" / "ckpt-20"))
        for name in mine.get_variable_to_shape_map():
            if name.startswith("model/"):
                np.testing.assert_array_equal(mine.get_tensor(name), theirs.get_tensor(name))


@pytest.mark.slow
def test_a_signal_to_one_worker_stops_every_worker_after_the_same_update(packed_dir, bert_config_file, tmp_path):
    """A preemption (SIGTERM) of one host of a cluster: the other worker went on into the next
    compiled loop and failed there once its peer had left (exit 1, an internal error). Now every
    worker stops after the same update and saves it: the signalled one says so (75), the other
    that a signal to another worker stopped it (75, the same command resumes)."""
    import signal
    import time

    out = tmp_path / "run"
    data = [f"--bert_config_file={bert_config_file}", f"--input_files={packed_dir}/packed-*.tfrecord",
            "--distribution_strategy=multi_worker_mirrored", "--num_train_steps=400", "--save_checkpoints_steps=400",
            "--eval_every_samples=0", "--log_every_steps=1000"]
    workers = two_workers(out, data)
    deadline = time.time() + 300
    while not (out / "train_log.jsonl").exists() or len(read_log(out / "train_log.jsonl")) < 2:
        assert time.time() < deadline and all(worker.poll() is None for worker in workers)
        time.sleep(0.1)
    workers[1].send_signal(signal.SIGTERM)
    ended = [worker.communicate(timeout=300)[1] for worker in workers]
    assert [worker.returncode for worker in workers] == [75, 75], ended[0][-3000:] + ended[1][-3000:]
    step = read_log(out / "train_log.jsonl")[-1]["step"]
    assert ended[0].strip().splitlines()[-1] == (f"run_pretraining: stopped by a signal to another worker after saving "
                                                 f"step {step}; the same command resumes (exit status 75)")
    assert ended[1].strip().splitlines()[-1] == (f"run_pretraining: stopped by SIGTERM after saving step {step}; the "
                                                 f"same command resumes (exit status 75)")
    for worker in ("", ".workers/worker-1/"):
        assert (out / f"{worker}checkpoints" / f"ckpt-{step}.index").exists(), worker
    assert not any(coordination_errors(stderr) for stderr in ended)


def test_odd_characters_and_a_relative_output_dir_resume_without_a_word(packed_dir, tmp_path, monkeypatch, caplog):
    """A run under `g [1]/ü *?{x}` (its init_checkpoint too), given as a relative path: killed after
    a checkpoint and resumed, it continues from that checkpoint, says nothing is damaged, and a
    glob over that directory finds its files."""
    from conftest import TINY

    from bert_packed.model import BertConfig, BertPretrainingModel, export_google_checkpoint

    odd = tmp_path / "g [1]" / "ü *?{x}"
    odd.mkdir(parents=True)
    initial = BertPretrainingModel(BertConfig(**TINY))
    initial.build()
    init = export_google_checkpoint(initial, str(odd / "init.ckpt-7"))
    monkeypatch.chdir(odd)
    settings = dict(num_train_steps=3, save_checkpoints_steps=1, init_checkpoint=init, learning_rate=0.0)
    with pytest.MonkeyPatch.context() as patch, killed_at(2, patch, "log line") as seen, pytest.raises(Killed):
        trained(config("run", tfrecords(packed_dir), **settings))
    assert seen[-1] == "log line"  # step 2's line, torn, after ckpt-1
    assert files.glob(str(odd / "run" / "checkpoints" / "ckpt-*.index")) == [str(odd / "run/checkpoints/ckpt-1.index")]
    caplog.clear()
    resumed = make_trainer(config("run", tfrecords(packed_dir), **settings))
    resumed.train()
    assert f"resumed from {os.path.join('run', 'checkpoints', 'ckpt-1')} at step 1" in caplog.text
    assert "damaged" not in caplog.text and "cannot restore" not in caplog.text
    assert [r["step"] for r in json.loads("[" + ",".join(open("run/train_log.jsonl")) + "]")] == [1, 2, 3]
    np.testing.assert_array_equal(resumed.model.encoder.embeddings.word_embeddings.numpy(),
                                  initial.encoder.embeddings.word_embeddings.numpy())


def test_what_killed_writers_left_is_gone_once_the_same_command_completes(unpacked_dir, corpus, tmp_path):
    """Temporary files of dead writers (hidden ones, and the visible names earlier releases used,
    which a `packed-*` glob would have trained on), a packer's .work and a checkpoint save's .saving
    are removed; a live writer's temporary file is kept."""
    from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, dataset_settings

    from bert_packed.features import Shapes
    from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset
    from bert_packed.pretraining_data.create_dataset import create_pretraining_dataset

    dead = 2**22 + 12345  # above any pid this machine gives out
    settings = PackSettings(Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, 3), "lp", num_shards=2)
    packed = tmp_path / "packed"
    pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(packed), settings, num_workers=1)
    clean = sorted(os.listdir(packed))
    (packed / ".work").mkdir()
    (packed / ".work" / "input-00000.json").write_text("{}")
    for name in (f".packed-00000-of-00002.tfrecord.tmp-{dead}", f"packed-00001-of-00002.tfrecord.tmp-{dead}",
                 f".metadata.json.tmp-{dead}"):
        (packed / name).write_bytes(b"half")
    (packed / f".histogram.json.tmp-{os.getpid()}").write_bytes(b"mine")  # a live writer's
    pack_pretraining_dataset(inputs_of(tfrecords(unpacked_dir)), str(packed), settings, num_workers=1)  # finished: nothing to do
    assert sorted(os.listdir(packed)) == sorted(clean + [f".histogram.json.tmp-{os.getpid()}"])

    created = tmp_path / "created"
    create_pretraining_dataset(corpus, str(created), dataset_settings(), num_workers=1)
    clean = sorted(os.listdir(created))
    (created / f".part-00000-000.tfrecord.tmp-{dead}").write_bytes(b"")
    create_pretraining_dataset(corpus, str(created), dataset_settings(), num_workers=1)
    assert sorted(os.listdir(created)) == clean
