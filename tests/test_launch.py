"""Launched by a scheduler: the cluster comes from a Slurm job step (TensorFlow's own
SlurmClusterResolver) or from TF_CONFIG as Kubeflow's TFJob sets it; what sums the gradients is a
flag; a launch given wrongly is one line naming the variable or flag; the workers leave together."""

import json
import os
import socket
import subprocess
import threading
import time
import types

import pytest
import tensorflow as tf
from conftest import REPO, run_command

from bert_packed.training import distribution


def slurm_step(rank, nodelist, tasks_per_node, num_tasks, node, **more):
    """The variables srun sets in task `rank` of a job step (those SlurmClusterResolver reads, and
    a few it does not)."""
    return {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_STEP_NUM_TASKS": str(num_tasks),
            "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURMD_NODENAME": node,
            **more}


@pytest.fixture
def environment(monkeypatch):
    """Sets the launcher's variables in this process, none of the machine's own left."""
    for name in list(os.environ):
        if name.startswith("SLURM") or name == "TF_CONFIG":
            monkeypatch.delenv(name)

    def set_up(variables):
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_up


@pytest.mark.parametrize("variables, resolved", [
    # One task a host, owning the GPUs Slurm gave it (the documented layout).
    (slurm_step(1, "gpu[07-08]", "1(x2)", 2, "gpu08", CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"),
     ({"worker": ["gpu07:9000", "gpu08:9000"]}, 1, 8, "0,1,2,3,4,5,6,7")),
    # Two tasks a host that see the host's 4 GPUs: consecutive ports, each its share, as Slurm listed them.
    (slurm_step(3, "gpu[07-08]", "2(x2)", 4, "gpu08", CUDA_VISIBLE_DEVICES="4,5,6,7"),
     ({"worker": ["gpu07:9000", "gpu07:9001", "gpu08:9000", "gpu08:9001"]}, 3, 2, "6,7")),
    # One task a GPU, bound by Slurm (--gpus-per-task=1): each keeps its own.
    (slurm_step(2, "gpu07", "4", 4, "gpu07", CUDA_VISIBLE_DEVICES="2", SLURM_GPUS_PER_TASK="1"),
     ({"worker": ["gpu07:9000", "gpu07:9001", "gpu07:9002", "gpu07:9003"]}, 2, 1, "2")),
    # Hosts without GPUs.
    (slurm_step(0, "cpu1,cpu2", "1,1", 2, "cpu1", CUDA_VISIBLE_DEVICES=""), ({"worker": ["cpu1:9000", "cpu2:9000"]}, 0,
                                                                              0, "")),
])
def test_slurm_s_resolver_gives_each_task_its_address_its_id_and_its_gpus(environment, variables, resolved):
    environment(variables)
    resolver = distribution.cluster_resolver("auto", 9000)
    cluster, task, gpus, visible = resolved
    assert resolver.cluster_spec().as_dict() == cluster
    assert (resolver.task_type, resolver.task_id) == ("worker", task)
    assert resolver.num_accelerators() == {"GPU": gpus}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible


def test_a_tfjob_s_tf_config_is_taken_as_it_is(environment):
    """Kubeflow's TFJob with a Chief and two Workers: its TF_CONFIG (and its "environment" key)."""
    cluster = {"chief": ["bert-chief-0.default.svc:2222"],
               "worker": ["bert-worker-0.default.svc:2222", "bert-worker-1.default.svc:2222"]}
    environment({"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1},
                                          "environment": "cloud"})})
    resolver = distribution.cluster_resolver("auto", 9000)
    assert resolver.cluster_spec().as_dict() == cluster and (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert distribution.tasks_in_environment() == (3, "TF_CONFIG")


TWO_WORKERS = json.dumps({"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
                          "task": {"type": "worker", "index": 0}})
MULTI_WORKER = "--distribution_strategy=multi_worker_mirrored"


@pytest.mark.parametrize("variables, flags, message", [
    # A batch script's own variables, outside srun.
    ({"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0"}, [MULTI_WORKER],
     "SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE not set: the cluster comes from a Slurm job "
     "step, whose variables srun sets in each task it starts"),
    ({k: v for k, v in slurm_step(0, "gpu[1-2]", "1(x2)", 2, "gpu1").items() if k != "SLURM_STEP_NODELIST"},
     [MULTI_WORKER], "SLURM_STEP_NODELIST not set"),
    ({}, [MULTI_WORKER, "--cluster_resolver=slurm"], "SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, "
                                                     "SLURM_STEP_TASKS_PER_NODE not set"),
    (slurm_step(0, "gpu1,gpu1", "1(x2)", 2, "gpu1"), [MULTI_WORKER],
     "SLURM_STEP_NODELIST=gpu1,gpu1 names gpu1 twice: a host is listed once"),
    (slurm_step(0, "gpu[9-10]", "1(x2)", 2, "gpu9"), [MULTI_WORKER],
     "SLURM_PROCID=0 runs on gpu9 (SLURMD_NODENAME), but SlurmClusterResolver, which numbers tasks host by host in the "
     "order of the hosts' names, puts task 0 on gpu10"),
    (slurm_step(0, "gpu[1-2]", "2(x2)", 4, "gpu1"), [MULTI_WORKER, "--slurm_port_base=65535"],
     "--slurm_port_base=65535: the 2 tasks of a host listen on it and the ports after it: must be in [1, 65534]"),
    (slurm_step(0, "gpu[1-2]", "1(x2)", 3, "gpu1"), [MULTI_WORKER],
     "SLURM_STEP_TASKS_PER_NODE=1(x2) counts 2 tasks, SLURM_STEP_NUM_TASKS=3: expected the same"),
    ({"TF_CONFIG": TWO_WORKERS.replace("2223", "2222")}, [MULTI_WORKER],
     "TF_CONFIG names 127.0.0.1:2222 twice (worker 0 and worker 1): each task listens on a host:port of its own"),
    ({"TF_CONFIG": TWO_WORKERS.replace("127.0.0.1:2223", "127.0.0.1")}, [MULTI_WORKER],
     "TF_CONFIG names '127.0.0.1' for worker 1: expected host:port, a port from 1 to 65535"),
    ({"TF_CONFIG": "[1, 2]"}, [MULTI_WORKER], "TF_CONFIG=[1, 2]: cannot be used (a JSON list, not an object)"),
    ({"TF_CONFIG": '{"cluster": {}}'}, [], 'TF_CONFIG={"cluster": {}}: names no chief or worker, so this process would '
                                         'train alone; unset it'),
    # A TF_CONFIG exported before srun: every task is index 0.
    ({"TF_CONFIG": TWO_WORKERS, **slurm_step(1, "gpu[1-2]", "1(x2)", 2, "gpu2")}, [MULTI_WORKER],
     "TF_CONFIG makes this task 0 of 2, the Slurm job step SLURM_PROCID=1 of SLURM_STEP_NUM_TASKS=2"),
    ({"TF_CONFIG": TWO_WORKERS}, ["--num_gpus=2"], "--num_gpus=2 trains on this host alone, but TF_CONFIG names 2 "
                                                   "tasks (a multi-worker cluster)"),
    (slurm_step(0, "gpu[1-2]", "1(x2)", 2, "gpu1"), ["--num_gpus=8"],
     "--num_gpus=8 trains on this host alone, but SLURM_STEP_NUM_TASKS names 2 tasks"),
    (slurm_step(0, "gpu[1-2]", "1(x2)", 2, "gpu1"), [], "--distribution_strategy=default trains on this host alone"),
    ({}, [MULTI_WORKER, "--num_gpus=8"], "--num_gpus=8 mirrors over one host's GPUs, but under "
                                         "--distribution_strategy=multi_worker_mirrored each worker trains on every "
                                         "GPU it sees: leave --num_gpus out"),
    ({}, ["--cluster_resolver=slurm"], "--cluster_resolver=slurm applies to --distribution_strategy="
                                       "multi_worker_mirrored, not default"),
    ({}, ["--all_reduce_alg=nccl"], "--all_reduce_alg=nccl applies to --distribution_strategy=mirrored (--num_gpus) or "
                                    "multi_worker_mirrored, not default"),
])
def test_a_launch_given_wrongly_is_one_line_before_anything_starts(packed_dir, bert_config_file, tmp_path, environment,
                                                                   variables, flags, message):
    environment(variables)
    result = run_command("run_pretraining", f"--bert_config_file={bert_config_file}",
                         f"--input_files={packed_dir}/packed-*.tfrecord", f"--output_dir={tmp_path / 'run'}", *flags)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_pretraining: error: ") and message in lines[0], result.stderr
    assert not (tmp_path / "run").exists()


def test_the_chief_leaves_once_the_other_workers_processes_have_ended(tmp_path):
    """The chief returns once every other worker's server port refuses connections; any other
    worker returns at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    other = f"127.0.0.1:{listener.getsockname()[1]}"
    cluster = {"worker": ["127.0.0.1:1", other]}

    def strategy(index):
        return types.SimpleNamespace(cluster_resolver=tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type="worker", task_id=index))

    start = time.monotonic()
    distribution.leave_together(strategy(1))
    assert time.monotonic() - start < 0.5
    threading.Timer(1.5, listener.close).start()  # the other worker's process ends
    distribution.leave_together(strategy(0))
    assert 1.5 <= time.monotonic() - start < 3.0


@pytest.mark.parametrize("all_reduce_alg, kind", [("auto", None), ("nccl", "NcclAllReduce"),
                                                  ("ring", "ReductionToOneDevice")])
def test_on_one_host_all_reduce_alg_picks_what_sums_the_replicas(all_reduce_alg, kind):
    """MirroredStrategy has no ring: "ring" is TensorFlow's reduction without NCCL; "auto" leaves
    the choice to TensorFlow (kind None: what it picks for the same devices)."""

    def summed_by(strategy):
        return type(strategy.extended._cross_device_ops).__name__

    strategy = distribution.mirrored(["/cpu:0"], all_reduce_alg)
    assert summed_by(strategy) == (kind or summed_by(tf.distribute.MirroredStrategy(["/cpu:0"])))


def free_port_pair():
    """A port p of this host such that p and p + 1 are free."""
    for _ in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_worker_waits_for_its_peers_saying_which_and_stops_at_its_limit(packed_dir, bert_config_file, tmp_path,
                                                                          environment):
    """A worker whose peer never came sat silent in TensorFlow's connect, deaf to SIGTERM and
    Ctrl-C: it now waits in Python, names the tasks and addresses, and stops at
    --cluster_wait_seconds in one line; a host that does not resolve is one line at once."""
    mine, theirs = free_port(), free_port()
    cluster = {"cluster": {"worker": [f"127.0.0.1:{mine}", f"127.0.0.1:{theirs}"]}, "task": {"type": "worker", "index": 0}}
    common = [f"--bert_config_file={bert_config_file}", f"--input_files={packed_dir}/packed-*.tfrecord", MULTI_WORKER]
    environment({"TF_CONFIG": json.dumps(cluster)})
    result = run_command("run_pretraining", *common, f"--output_dir={tmp_path / 'run'}", "--cluster_wait_seconds=1.5")
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"waiting for worker 1 at 127.0.0.1:{theirs} (--cluster_wait_seconds=1.5)" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"run_pretraining: error: worker 1 at 127.0.0.1:{theirs} did not answer within --cluster_wait_seconds=1.5: "
        f"start every task of the cluster (or check the addresses and that their ports are open between the hosts)")
    cluster["cluster"]["worker"][1] = "no-such-host.invalid:2223"
    environment({"TF_CONFIG": json.dumps(cluster)})
    result = run_command("run_pretraining", *common, f"--output_dir={tmp_path / 'run2'}")
    assert result.returncode == 2 and "worker 1's address no-such-host.invalid:2223: its host does not resolve" in (
        result.stderr.strip().splitlines()[-1]), result.stderr[-3000:]


def test_a_tpu_that_cannot_be_reached_is_one_line_naming_its_flag(packed_dir, bert_config_file, tmp_path):
    """--use_tpu at an address nobody answers sat in TensorFlow's connect for good, and a TPU name
    that does not resolve ended in a traceback: each is one line naming the flag."""
    common = [f"--bert_config_file={bert_config_file}", f"--input_files={packed_dir}/packed-*.tfrecord", "--use_tpu"]
    port = free_port()
    cases = {(f"--tpu_name=grpc://127.0.0.1:{port}", "--cluster_wait_seconds=1"):
             f"--tpu_name=grpc://127.0.0.1:{port}: the TPU did not answer within --cluster_wait_seconds=1: check the "
             f"address and that its port is open from this host",
             ("--master=grpc://no-such-host.invalid:8470",):
             "--master=grpc://no-such-host.invalid:8470: its host does not resolve"}
    for index, (flags, message) in enumerate(cases.items()):
        result = run_command("run_pretraining", *common, *flags, f"--output_dir={tmp_path / str(index)}")
        assert result.returncode == 2, result.stderr[-3000:]
        assert result.stderr.strip().splitlines()[-1].startswith(f"run_pretraining: error: {message}"), result.stderr


@pytest.mark.slow  # the process is the subject: a signal while it waits for its peers
def test_sigterm_ends_a_worker_waiting_for_its_peers_at_once(packed_dir, bert_config_file, tmp_path):
    import signal
    import sys

    mine, theirs = free_port(), free_port()
    env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": {"worker": [f"127.0.0.1:{mine}", f"127.0.0.1:{theirs}"]},
                                                  "task": {"type": "worker", "index": 0}})}
    process = subprocess.Popen([sys.executable, "run_pretraining.py", f"--bert_config_file={bert_config_file}",
                                f"--input_files={packed_dir}/packed-*.tfrecord", MULTI_WORKER,
                                f"--output_dir={tmp_path / 'run'}"], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:  # the line that says what it waits for
        lines.append(line)
        if "waiting for worker 1" in line:
            break
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    rest = process.stderr.read()
    assert process.wait(timeout=30) == 143 and time.monotonic() - started < 10, "".join(lines) + rest
    assert "stopped (SIGTERM)" in rest.strip().splitlines()[-1]
