"""Several devices and hosts: where a multi-worker run's cluster comes from (TF_CONFIG, a Slurm job
step), the strategies and what sums their gradients, who is who among the workers, deciding
together, and leaving together."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time

import tensorflow as tf

# The resolver's own parsers of Slurm's node and task lists, so that the checks read the
# variables as the resolver does (TensorFlow exports the resolver, not them).
from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

from bert_packed.errors import SettingsError

# The variables of a Slurm job step that SlurmClusterResolver reads. srun sets them in each task
# it starts; a batch script outside srun has SLURM_PROCID but none of the step's.
SLURM_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
# The tasks that train together (and that TensorFlow's coordination service coordinates), the
# chief first: a TFJob's evaluator or parameter servers do not.
TRAINING_JOBS = ("chief", "worker")
# How long a worker waits for the others by default, and how often it says so.
CLUSTER_WAIT_SECONDS, WAIT_LINE_SECONDS = 900.0, 30.0
TF_CONFIG_EXPECTED = ('{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": N}} '
                      '(docs/launch.md)')
# How long the chief waits for the other workers' processes to end before it leaves anyway: they
# have only their last writes and their summary line to do.
LEAVING_SECONDS = 60.0


def cluster_resolver(source: str, slurm_port_base: int) -> tf.distribute.cluster_resolver.ClusterResolver:
    """The cluster this process is a task of, for MultiWorkerMirroredStrategy, checked before any
    server starts or any device is used.

    Args:
      source: "tf_config" (TF_CONFIG, as Kubeflow's TFJob sets it; unset: this process alone),
        "slurm" (the Slurm job step srun started, through TensorFlow's SlurmClusterResolver), or
        "auto": TF_CONFIG when it is set, else Slurm when a job step's variables are, else this
        process alone. A TF_CONFIG inside a Slurm step of several tasks must agree with the step.
      slurm_port_base: under Slurm, the port of each host's first task (--slurm_port_base).

    Returns:
      A TFConfigClusterResolver, or a SimpleClusterResolver holding what SlurmClusterResolver
      resolved (Slurm's GPU binding applied to CUDA_VISIBLE_DEVICES).

    Raises:
      SettingsError: naming the variable that is missing or wrong, or the one that disagrees.
    """
    in_slurm_step = any(name in os.environ for name in SLURM_STEP_VARIABLES)
    if source == "auto":
        if "TF_CONFIG" not in os.environ and in_slurm_step:
            return _slurm_cluster(slurm_port_base)
        resolver = _tf_config_cluster()
        _require_the_slurm_step_agrees(resolver)
        return resolver
    return _slurm_cluster(slurm_port_base) if source == "slurm" else _tf_config_cluster()


def tasks_in_environment() -> tuple[int, str]:
    """How many tasks train together by what the launcher set, and the variable that says so:
    TF_CONFIG's chief and workers, else a Slurm job step's SLURM_STEP_NUM_TASKS, else (1, "").

    Raises:
      SettingsError: TF_CONFIG or SLURM_STEP_NUM_TASKS cannot be read.
    """
    if "TF_CONFIG" in os.environ:
        return max(1, len(_training_tasks(_tf_config_cluster().cluster_spec()))), "TF_CONFIG"
    if "SLURM_STEP_NUM_TASKS" in os.environ:
        return _slurm_integer("SLURM_STEP_NUM_TASKS"), "SLURM_STEP_NUM_TASKS"
    return 1, ""


def multi_worker_mirrored(resolver: tf.distribute.cluster_resolver.ClusterResolver, all_reduce_alg: str,
                          wait_seconds: float = CLUSTER_WAIT_SECONDS) -> tf.distribute.MultiWorkerMirroredStrategy:
    """MultiWorkerMirroredStrategy over `resolver`'s cluster, its gradients summed by
    `all_reduce_alg`: "nccl", "ring" (TensorFlow's own collectives over gRPC) or "auto"
    (TensorFlow's choice, which in 2.21 is its ring: its runtime takes NCCL only when asked),
    once every other task answers (wait_for_the_cluster, up to `wait_seconds`)."""
    wait_for_the_cluster(resolver, wait_seconds)
    implementation = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
                      "ring": tf.distribute.experimental.CommunicationImplementation.RING}[all_reduce_alg]
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)


def wait_for_the_cluster(resolver: tf.distribute.cluster_resolver.ClusterResolver, seconds: float) -> None:
    """Returns once every other task of the cluster accepts a connection at its address; says which
    it waits for, every WAIT_LINE_SECONDS. TensorFlow's own connect, inside the strategy's
    constructor, waits without end and without a word, and Python's signal handlers never run
    meanwhile (only kill -9 ended a worker whose peer never came): here, SIGTERM and Ctrl-C end
    the wait as they end a command.

    Meanwhile this task listens on its own port, so that the others see it too (TensorFlow's server
    takes the port over once the wait is done).

    Raises:
      SettingsError: an address whose host does not resolve, or tasks that did not answer within
        `seconds` (--cluster_wait_seconds), named with their addresses.
    """
    spec, me = resolver.cluster_spec(), (resolver.task_type, resolver.task_id)
    addresses = {(job, index): str(spec.task_address(job, index)) for job, index in _training_tasks(spec)}
    for (job, index), address in addresses.items():
        host, _, port = address.rpartition(":")
        try:
            socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            raise SettingsError(f"{job} {index}'s address {address}: its host does not resolve ({e.strerror or e}); "
                                f"expected the cluster's hosts by names this host knows") from None
    waiting = {task: address for task, address in addresses.items() if task != me}
    if not waiting:
        return
    own_port = int(addresses[me].rpartition(":")[2]) if me in addresses else None
    listener = _listen(own_port)
    start = last_line = time.monotonic()
    try:
        logging.info("waiting for %s (--cluster_wait_seconds=%g)", _tasks_at(waiting), seconds)
        while waiting:
            for task, address in list(waiting.items()):
                host, _, port = address.rpartition(":")
                try:
                    socket.create_connection((host, int(port)), timeout=1.0).close()
                    del waiting[task]
                except OSError:
                    pass
            if not waiting:
                break
            now = time.monotonic()
            if now - start > seconds:
                raise SettingsError(f"{_tasks_at(waiting)} did not answer within --cluster_wait_seconds={seconds:g}: "
                                    f"start every task of the cluster (or check the addresses and that their ports are "
                                    f"open between the hosts)")
            if now - last_line > WAIT_LINE_SECONDS:
                logging.info("still waiting for %s (%.0f s)", _tasks_at(waiting), now - start)
                last_line = now
            time.sleep(0.5)
    finally:
        if listener is not None:
            listener.close()


def wait_for_tpu(address: str, seconds: float, flag: str) -> None:
    """Waits until the TPU at `address` (grpc://host:port) takes a connection: TensorFlow's own
    connect waits without end for one that never answers.

    Raises:
      SettingsError: naming `flag` (--tpu_name, say), when its host does not resolve or it has not
        answered within `seconds` (--cluster_wait_seconds).
    """
    host, _, port = address.removeprefix("grpc://").rpartition(":")
    if not host or not port.isdigit():
        raise SettingsError(f"{flag}={address}: expected grpc://host:port")
    start = last_line = time.monotonic()
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return
        except (socket.gaierror, UnicodeError) as e:
            raise SettingsError(f"{flag}={address}: its host does not resolve ({e.strerror or e})") from None
        except OSError:
            pass
        now = time.monotonic()
        if now - start > seconds:
            raise SettingsError(f"{flag}={address}: the TPU did not answer within --cluster_wait_seconds={seconds:g}: "
                                f"check the address and that its port is open from this host")
        if now - last_line > WAIT_LINE_SECONDS:
            logging.info("still waiting for the TPU at %s (%.0f s)", address, now - start)
            last_line = now
        time.sleep(0.5)


def _tasks_at(tasks: dict) -> str:
    return ", ".join(f"{job} {index} at {address}" for (job, index), address in sorted(tasks.items()))


def _listen(port: int | None):
    """A socket listening on `port` (None: none could be opened, as when the port is in use)."""
    if port is None:
        return None
    try:
        return socket.create_server(("", port), reuse_port=hasattr(socket, "SO_REUSEPORT"))
    except OSError:
        return None


def mirrored(devices: list[str] | None, all_reduce_alg: str) -> tf.distribute.MirroredStrategy:
    """MirroredStrategy over `devices` (None: every GPU of the host, else the CPU), its gradients
    summed by `all_reduce_alg`: "nccl" (NcclAllReduce), "ring" (ReductionToOneDevice) or "auto"
    (TensorFlow's choice: its collective all-reduce, over NCCL between GPUs, a ring between CPUs)."""
    # "ring" asks, as on several hosts, for TensorFlow's own reduction instead of NCCL. The ring
    # TensorFlow runs between one process's CPUs is not public (its CollectiveAllReduce wants the
    # strategy's internal keys); the public reduction without NCCL sums on one device and copies
    # the sum back, as TensorFlow itself does for a mix of CPUs and GPUs.
    if all_reduce_alg == "nccl":
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.NcclAllReduce())
    if all_reduce_alg == "ring":
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    return tf.distribute.MirroredStrategy(devices)


def worker_resolver(strategy: tf.distribute.Strategy):
    """The strategy's cluster resolver when this process is one worker of several, else None."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver if resolver is not None and resolver.task_type else None


def chief(strategy: tf.distribute.Strategy) -> tuple[bool, int]:
    """(whether this process is the chief, its task index): the chief writes output_dir, every
    other worker output_dir/.workers/worker-N."""
    resolver = worker_resolver(strategy)
    if resolver is None:
        return True, 0
    cluster = resolver.cluster_spec().as_dict()
    if "chief" in cluster:
        return resolver.task_type == "chief", resolver.task_id or 0
    return resolver.task_type == "worker" and resolver.task_id == 0, resolver.task_id or 0


def common_step(strategy: tf.distribute.Strategy, newest: int, can_restore) -> int:
    """The newest checkpoint step every worker can restore (0: none), from each worker's newest
    readable step and whether it can restore a given one: a kill can come between two workers'
    saves, and workers resumed at different steps would wait on each other's collectives."""
    if worker_resolver(strategy) is None:
        return newest
    gather = _compiled(strategy)[0]
    step = int(gather(tf.constant(newest, tf.int64)).numpy().min())
    # Every worker must hold that step (one ahead may have deleted an old one): else none (0).
    held = step == 0 or can_restore(step)
    return step if all(gather(tf.constant(int(held), tf.int64)).numpy()) else 0


def on_any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """Whether `flag` holds on any worker. Each worker reads its own files, and a kill can come
    between two workers' writes: deciding together keeps every worker in the same collectives."""
    if worker_resolver(strategy) is None:  # one worker: nobody to agree with
        return flag
    any_worker = _compiled(strategy)[1]
    return bool(any_worker(tf.constant(1.0 if flag else 0.0)).numpy() > 0.0)


@functools.cache
def _compiled(strategy: tf.distribute.Strategy):
    """The strategy's collectives for deciding together, compiled once: a tf.function made anew
    at every call is traced anew (and TensorFlow warns of it). No control flow on tensors: traced
    as written, without AutoGraph's conversion of their source (as every compiled function here)."""

    @tf.function(autograph=False)
    def gather(value):
        return strategy.gather(strategy.run(lambda: tf.reshape(tf.identity(value), [1])), axis=0)

    @tf.function(autograph=False)
    def any_worker(value):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(value)), axis=None)

    return gather, any_worker


def leave_together(strategy: tf.distribute.Strategy) -> None:
    """Returns at once on every worker but the chief, and on the chief once every other worker's
    process has ended (after LEAVING_SECONDS at most, with a warning): the chief leaves last.

    Call it when the run is over on every worker (its last collective done), before the process
    ends; one worker alone returns at once.
    """
    # TensorFlow's coordination service lives in the chief's process, and every other worker's
    # agent heartbeats to it until that worker's process ends: a worker that outlives the chief by
    # a heartbeat ends on "E0000 ... StartAbort UNAVAILABLE: Failed to send RPC to coordination
    # service". TensorFlow 2.21 has a shutdown barrier for this (shutdown_barrier_timeout_in_ms of
    # the coordination service's config), but only the agent's Shutdown() enters it, and Python
    # never calls that: at exit the server is released, not shut down ("Servers don't support
    # clean shutdown"), and a reset context does not reach it either. A barrier that every worker
    # passes (a collective, or the service's own WaitAtBarrier) still lets the chief exit while
    # the others do their last writes. So the chief waits until each other worker's server port,
    # open until its process ends, refuses a connection.
    resolver = worker_resolver(strategy)
    if resolver is None or not chief(strategy)[0]:
        return
    spec = resolver.cluster_spec()
    others = [spec.task_address(job, index) for job, index in _training_tasks(spec)
              if (job, index) != (resolver.task_type, resolver.task_id)]
    deadline = time.monotonic() + LEAVING_SECONDS
    while others and time.monotonic() < deadline:
        time.sleep(0.2)
        others = [address for address in others if _listening(address)]
    if others:
        logging.warning("%s still running %.0f s after the run ended; the chief leaves without waiting for them "
                        "(their last line may be TensorFlow's about the coordination service)", ", ".join(others),
                        LEAVING_SECONDS)


def _listening(address: str) -> bool:
    """Whether a server accepts connections at `address` (host:port, or [IPv6]:port)."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
    except OSError:  # refused (its process ended), unreachable or unknown: nobody to wait for
        return False
    return True


def _training_tasks(spec: tf.train.ClusterSpec) -> list[tuple[str, int]]:
    """The (job, index) of every task of `spec` that trains, the chief first: the order of ids
    TensorFlow gives them (a Slurm task's SLURM_PROCID is its id)."""
    return [(job, index) for job in TRAINING_JOBS if job in spec.jobs for index in spec.task_indices(job)]


def _tf_config_cluster() -> tf.distribute.cluster_resolver.TFConfigClusterResolver:
    """The cluster TF_CONFIG names (none when it is not set), checked: it reads, this task is a
    chief or worker in its cluster, and no two tasks share an address."""
    text = os.environ.get("TF_CONFIG", "")
    try:
        parsed = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise SettingsError(f"TF_CONFIG={text}: cannot be used ({e}); expected {TF_CONFIG_EXPECTED}") from None
    if not isinstance(parsed, dict):
        raise SettingsError(f"TF_CONFIG={text}: cannot be used (a JSON {type(parsed).__name__}, not an object); "
                            f"expected {TF_CONFIG_EXPECTED}")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    try:
        spec, task = resolver.cluster_spec(), (resolver.task_type, resolver.task_id)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # bad JSON is a ValueError
        raise SettingsError(f"TF_CONFIG={text}: cannot be used ({str(e).splitlines()[0]}); expected "
                            f"{TF_CONFIG_EXPECTED}") from None
    tasks = _training_tasks(spec)
    if text.strip() and not tasks:
        raise SettingsError(f"TF_CONFIG={text}: names no chief or worker, so this process would train alone; unset "
                            f"it for a run of one process, or expected {TF_CONFIG_EXPECTED}")
    if spec.jobs and task not in tasks:
        raise SettingsError(f"TF_CONFIG={text}: its task (type {task[0]}, index {task[1]}) is not a chief or worker "
                            f"of its cluster; expected {TF_CONFIG_EXPECTED}")
    first_of = {}
    for job, index in tasks:
        address = spec.task_address(job, index)
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise SettingsError(f"TF_CONFIG names {address!r} for {job} {index}: expected host:port, a port from 1 to "
                                f"65535 (docs/launch.md)")
        if address in first_of:
            raise SettingsError(f"TF_CONFIG names {address} twice ({first_of[address]} and {job} {index}): each task "
                                f"listens on a host:port of its own")
        first_of[address] = f"{job} {index}"
    return resolver


def _require_the_slurm_step_agrees(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver) -> None:
    """Raises SettingsError when TF_CONFIG and the Slurm job step of several tasks around this
    process disagree on the number of tasks or on this one's: a TF_CONFIG exported before srun
    gives every task the same index."""
    if "SLURM_PROCID" not in os.environ or "SLURM_STEP_NUM_TASKS" not in os.environ:
        return
    rank, num_tasks = _slurm_integer("SLURM_PROCID"), _slurm_integer("SLURM_STEP_NUM_TASKS")
    tasks = _training_tasks(resolver.cluster_spec())
    mine = tasks.index((resolver.task_type, resolver.task_id)) if tasks else 0
    if num_tasks > 1 and (len(tasks), mine) != (num_tasks, rank):
        raise SettingsError(f"TF_CONFIG makes this task {mine} of {len(tasks)}, the Slurm job step SLURM_PROCID={rank} "
                            f"of SLURM_STEP_NUM_TASKS={num_tasks} (a TF_CONFIG exported before srun gives every task the "
                            f"same): unset TF_CONFIG to take the cluster from Slurm, or give --cluster_resolver=tf_config "
                            f"to take TF_CONFIG's")


def _slurm_integer(name: str) -> int:
    """The Slurm variable `name` as an integer, or SettingsError naming it."""
    value = os.environ[name]
    if not value.strip().isdigit():
        raise SettingsError(f"{name}={value}: expected a whole number, as Slurm sets it")
    return int(value)


def _slurm_step() -> tuple[int, dict[str, int]]:
    """(SLURM_PROCID, {host: its tasks}) of the job step, checked as far as
    SlurmClusterResolver needs it: a variable it lacks or misreads is one line here, not its
    RuntimeError (or a dictionary that silently drops a host listed twice)."""
    missing = [name for name in SLURM_STEP_VARIABLES if name not in os.environ]
    if missing:
        raise SettingsError(f"{', '.join(missing)} not set: the cluster comes from a Slurm job step, whose variables "
                            f"srun sets in each task it starts (a batch script outside srun has none of them); start "
                            f"the command with srun (docs/launch.md#slurm)")
    rank, num_tasks = _slurm_integer("SLURM_PROCID"), _slurm_integer("SLURM_STEP_NUM_TASKS")
    nodelist, per_node = os.environ["SLURM_STEP_NODELIST"], os.environ["SLURM_STEP_TASKS_PER_NODE"]
    try:
        hosts = slurm_cluster_resolver.expand_hostlist(nodelist)
    except ValueError:
        raise SettingsError(f"SLURM_STEP_NODELIST={nodelist}: not a Slurm node list (as in gpu[01-02],gpu07)") from None
    try:
        tasks = slurm_cluster_resolver.expand_tasks_per_node(per_node)
    except ValueError:
        raise SettingsError(f"SLURM_STEP_TASKS_PER_NODE={per_node}: not a Slurm task count list (as in "
                            f"8(x2),4)") from None
    twice = sorted({host for host in hosts if hosts.count(host) > 1})
    if twice:
        raise SettingsError(f"SLURM_STEP_NODELIST={nodelist} names {', '.join(twice)} twice: a host is listed once, "
                            f"its tasks counted in SLURM_STEP_TASKS_PER_NODE")
    if len(tasks) != len(hosts):
        raise SettingsError(f"SLURM_STEP_TASKS_PER_NODE={per_node} counts the tasks of {len(tasks)} hosts, "
                            f"SLURM_STEP_NODELIST={nodelist} names {len(hosts)}: expected a count for each host")
    if sum(tasks) != num_tasks:
        raise SettingsError(f"SLURM_STEP_TASKS_PER_NODE={per_node} counts {sum(tasks)} tasks, SLURM_STEP_NUM_TASKS="
                            f"{num_tasks}: expected the same")
    if rank >= num_tasks:
        raise SettingsError(f"SLURM_PROCID={rank}: expected one of the SLURM_STEP_NUM_TASKS={num_tasks} tasks, 0 to "
                            f"{num_tasks - 1}")
    return rank, dict(zip(hosts, tasks))


def _slurm_gpus(tasks_per_host: int) -> tuple[int, bool]:
    """(the GPUs this task trains on, whether SlurmClusterResolver hands them out) for a host of
    `tasks_per_host` tasks (the most of any host), before any GPU is used.

    The GPUs a task sees are those Slurm gave it (CUDA_VISIBLE_DEVICES), else every GPU of the
    host (nvidia-smi counts them, as the resolver does; none without it). Where each task sees at
    least one GPU per task of its host, and Slurm did not bind GPUs to tasks (--gpus-per-task),
    the resolver splits them: task k of a host takes the k-th share. Else each task keeps what it
    sees: one task a host owns the host's GPUs, and a task Slurm bound to its GPUs keeps them.
    """
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:  # CUDA takes the devices before the first negative one ("-1": none)
        devices = [device.strip() for device in listed.split(",") if device.strip()]
        seen = next((i for i, device in enumerate(devices) if device.startswith("-")), len(devices))
    else:
        try:
            seen = slurm_cluster_resolver.get_num_gpus()
        except (OSError, RuntimeError):  # no nvidia-smi, or it failed: a host without GPUs
            seen = 0
    split = seen >= tasks_per_host and "SLURM_GPUS_PER_TASK" not in os.environ
    return (seen // tasks_per_host if split else seen), split


def _slurm_cluster(port_base: int) -> tf.distribute.cluster_resolver.SimpleClusterResolver:
    """The cluster of the Slurm job step, as SlurmClusterResolver resolves it (cluster_resolver)."""
    rank, tasks_of = _slurm_step()
    busiest = max(tasks_of.values())
    if not 1 <= port_base <= 65536 - busiest:
        raise SettingsError(f"--slurm_port_base={port_base}: the {busiest} tasks of a host listen on it and the "
                            f"ports after it: must be in [1, {65536 - busiest}]")
    gpus, split = _slurm_gpus(busiest)
    # The resolver lists a host's tasks by stepping through its GPUs, so it cannot list a task
    # without one (gpus_per_task=0 is a zero step: tensorflow/tensorflow#56894). Where it does not
    # hand out GPUs, it is given one a task, which only makes it list every task.
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port_base, gpus_per_node=gpus * busiest if split else busiest, gpus_per_task=gpus if split else 1,
        auto_set_gpu=split)
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    spec = resolver.cluster_spec()
    if split and listed:
        # The resolver numbers the GPUs 0..n-1, which are the devices Slurm listed only where its
        # cgroup renumbers them: taken through Slurm's list, they are the GPUs Slurm gave.
        devices = listed.split(",")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices[int(i)] for i in os.environ["CUDA_VISIBLE_DEVICES"].split(","))
    host = spec.task_address("worker", rank).rsplit(":", 1)[0]
    node = os.environ.get("SLURMD_NODENAME", host)
    if node != host:
        raise SettingsError(f"SLURM_PROCID={rank} runs on {node} (SLURMD_NODENAME), but SlurmClusterResolver, which "
                            f"numbers tasks host by host in the order of the hosts' names, puts task {rank} on {host}: "
                            f"use Slurm's default block distribution (no --distribution=cyclic) and host names that "
                            f"sort alike as text and as numbers, or give each task a TF_CONFIG")
    # MultiWorkerMirroredStrategy asks a resolver (other than TF_CONFIG's) for its task's GPUs,
    # and SlurmClusterResolver answers its gpus_per_task, never 0 (above): the count is given here.
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="worker", task_id=rank,
                                                                num_accelerators={"GPU": gpus}, rpc_layer="grpc")
