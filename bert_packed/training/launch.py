"""How a training run is spread over devices and hosts: the distribution settings that
pre-training and fine-tuning share (one part, composed by both commands' settings), checked
before any work, and the tf.distribute strategy they ask for (bert_packed/training/distribution.py
does the cluster's work). None of it is part of a run's identity: a run resumes the same under
another launch.
"""

from __future__ import annotations

import dataclasses

from bert_packed.errors import SettingsError
from bert_packed.settings import check_settings, given_or_changed, setting, settings_of

# Where a multi-worker run's cluster comes from: TF_CONFIG, a Slurm job step, or whichever is there.
CLUSTER_RESOLVERS = ("auto", "tf_config", "slurm")
# What sums the gradients across devices and hosts: NCCL, TensorFlow's ring, or TensorFlow's choice.
ALL_REDUCE_ALGORITHMS = ("auto", "nccl", "ring")
# TensorFlow's SlurmClusterResolver's own port_base: task k of a host listens on SLURM_PORT_BASE + k.
SLURM_PORT_BASE = 8888
DISTRIBUTION_GROUP = "distribution"
# tf.distribute's strategies (--distribution_strategy; the reference's --use_tpu and --num_gpus choose one too).
STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "tpu")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributionSettings:
    """The devices and hosts a run trains on, as the MLPerf reference's flags and tf.distribute's
    strategies say it (docs/launch.md). `given`: the names of the settings the command line gave
    (a flag not given is its default; some apply only when given); from Python, any value other
    than its default counts as given too."""

    distribution_strategy: str = setting("default", "tf.distribute strategy (multi_worker_mirrored: the cluster from "
                                                    "--cluster_resolver).", group=DISTRIBUTION_GROUP, choices=STRATEGIES)
    num_gpus: int = setting(0, "GPUs: more than 1 mirrors over that many (--distribution_strategy=mirrored); checked "
                               "against the GPUs visible.", group=DISTRIBUTION_GROUP)
    cluster_resolver: str = setting(
        "auto", "With multi_worker_mirrored, where the cluster comes from: tf_config (TF_CONFIG, as Kubeflow's TFJob "
                "sets it), slurm (the Slurm job step srun starts, through TensorFlow's SlurmClusterResolver), or auto: "
                "TF_CONFIG when set, else Slurm inside a job step, else this host alone.",
        group=DISTRIBUTION_GROUP, choices=CLUSTER_RESOLVERS)
    slurm_port_base: int = setting(
        SLURM_PORT_BASE, "Under Slurm, the port of each host's first task (task k of a host listens on "
                         "slurm_port_base + k): open it between the hosts (TensorFlow's default).",
        group=DISTRIBUTION_GROUP)
    cluster_wait_seconds: float = setting(
        900.0, "With multi_worker_mirrored, how long a worker waits for the cluster's other tasks to answer at their "
               "addresses (it says which, every 30 s) before it stops, in one line naming them; with --use_tpu and a "
               "grpc:// address, how long it waits for the TPU.",
        group=DISTRIBUTION_GROUP)
    all_reduce_alg: str = setting(
        "auto", "What sums the gradients: nccl (give it on GPUs); ring (TensorFlow's own collectives over gRPC; on one "
                "host, its reduction to one device); auto: TensorFlow's choice, which under multi_worker_mirrored is "
                "its ring (docs/launch.md).", group=DISTRIBUTION_GROUP, choices=ALL_REDUCE_ALGORITHMS)
    use_tpu: bool = setting(False, "Run on a TPU (--tpu_name or --master names it).", group=DISTRIBUTION_GROUP)
    tpu_name: str | None = setting(None, "TPU name or grpc:// address (the reference's name of --tpu).",
                                   group=DISTRIBUTION_GROUP)
    tpu: str | None = setting(None, "TPU name or address (= --tpu_name).", group=DISTRIBUTION_GROUP)
    tpu_zone: str | None = setting(None, "GCE zone of the TPU (default: detected).", group=DISTRIBUTION_GROUP)
    gcp_project: str | None = setting(None, "GCP project of the TPU (default: detected).", group=DISTRIBUTION_GROUP)
    master: str | None = setting(None, "TPU master address, used with --use_tpu when --tpu_name is not given.",
                                 group=DISTRIBUTION_GROUP)
    num_tpu_cores: int = setting(8, "TPU cores; checked against the TPU found when given.", group=DISTRIBUTION_GROUP)
    given: frozenset[str] = frozenset()

    def __post_init__(self):
        check_settings(self, DistributionSettings)
        if self.num_gpus < 0:
            raise SettingsError(f"--num_gpus={self.num_gpus}: expected 0 or more")
        if self.master and not self.use_tpu:
            raise SettingsError(f"--master={self.master}: cannot be honoured without --use_tpu (it is the TF1 master "
                                f"of a TPU job; other jobs here use tf.distribute and TF_CONFIG)")
        if self.strategy_name() == "tpu" and not (self.tpu_address() or self.master):
            raise SettingsError("--use_tpu (--distribution_strategy=tpu) needs --tpu_name (or --tpu, or --master)")
        name, given = self.strategy_name(), self.given_settings()
        if name == "multi_worker_mirrored" and self.cluster_wait_seconds <= 0:
            raise SettingsError(f"--cluster_wait_seconds={self.cluster_wait_seconds:g}: expected a wait above 0")
        if "cluster_resolver" in given and name != "multi_worker_mirrored":
            raise SettingsError(f"--cluster_resolver={self.cluster_resolver} applies to "
                                f"--distribution_strategy=multi_worker_mirrored, not {name}")
        if "all_reduce_alg" in given and name not in ("mirrored", "multi_worker_mirrored"):
            raise SettingsError(f"--all_reduce_alg={self.all_reduce_alg} applies to --distribution_strategy=mirrored "
                                f"(--num_gpus) or multi_worker_mirrored, not {name}")

    def given_settings(self) -> frozenset[str]:
        """The distribution settings given (settings.given_or_changed)."""
        return given_or_changed(self) & {field.name for field in settings_of(DistributionSettings)}

    def strategy_name(self) -> str:
        """--distribution_strategy, after the reference's --use_tpu and --num_gpus."""
        name, gpus = self.distribution_strategy, self.num_gpus
        explicit = "distribution_strategy" in self.given_settings()
        wanted = "tpu" if self.use_tpu else "mirrored" if gpus > 1 else None
        if wanted is None:
            return name
        if explicit and name == "multi_worker_mirrored" and not self.use_tpu:
            raise SettingsError(f"--num_gpus={gpus} mirrors over one host's GPUs, but under "
                                f"--distribution_strategy=multi_worker_mirrored each worker trains on every GPU it "
                                f"sees: leave --num_gpus out")
        if explicit and name != wanted:
            what = "--use_tpu" if self.use_tpu else f"--num_gpus={gpus}"
            raise SettingsError(f"{what} asks for --distribution_strategy={wanted}, but --distribution_strategy={name}")
        return wanted

    def tpu_address(self) -> str | None:
        """--tpu or the reference's --tpu_name; both given must agree."""
        if self.tpu and self.tpu_name and self.tpu != self.tpu_name:
            raise SettingsError(f"--tpu={self.tpu} and --tpu_name={self.tpu_name} disagree; give one of them")
        return self.tpu_name or self.tpu


def cluster_of_this_task(settings: DistributionSettings):
    """The cluster this process is a task of (a TensorFlow ClusterResolver) under
    multi_worker_mirrored, else None; the visible GPUs and the environment's tasks checked
    against what the settings ask.

    It comes first: under Slurm the resolver gives this task its GPUs (CUDA_VISIBLE_DEVICES),
    before any GPU is used, and a wrong launch is said before any other work.
    """
    from bert_packed.training import distribution

    name, cluster = settings.strategy_name(), None
    if name == "multi_worker_mirrored":
        cluster = distribution.cluster_resolver(settings.cluster_resolver, settings.slurm_port_base)
    elif name in ("default", "mirrored"):
        tasks, variable = distribution.tasks_in_environment()
        if tasks > 1:
            what = f"--num_gpus={settings.num_gpus}" if settings.num_gpus > 1 else f"--distribution_strategy={name}"
            raise SettingsError(f"{what} trains on this host alone, but {variable} names {tasks} tasks (a multi-worker "
                                f"cluster): give --distribution_strategy=multi_worker_mirrored, under which each "
                                f"worker trains on every GPU it sees")
    if settings.num_gpus > 0:
        import tensorflow as tf

        visible = len(tf.config.list_physical_devices("GPU"))
        if visible < settings.num_gpus:
            raise SettingsError(f"--num_gpus={settings.num_gpus}: cannot be honoured, {visible} GPUs are visible")
    return cluster


def make_strategy(settings: DistributionSettings, cluster):
    """The tf.distribute strategy the settings ask for; `cluster`: what cluster_of_this_task returned."""
    import tensorflow as tf

    from bert_packed.training import distribution

    name = settings.strategy_name()
    if name == "mirrored":
        devices = [f"/gpu:{i}" for i in range(settings.num_gpus)] if settings.num_gpus > 1 else None
        return distribution.mirrored(devices, settings.all_reduce_alg)
    if name == "multi_worker_mirrored":
        return distribution.multi_worker_mirrored(cluster, settings.all_reduce_alg, settings.cluster_wait_seconds)
    if name == "tpu":
        address = settings.tpu_address() or settings.master
        flag = "--master" if address == settings.master and not settings.tpu_address() else "--tpu_name"
        if address.startswith("grpc://"):
            distribution.wait_for_tpu(address, settings.cluster_wait_seconds, flag)
        try:  # a name is looked up through the cloud's metadata server, an address connected to
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=address, zone=settings.tpu_zone, project=settings.gcp_project)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (OSError, ValueError, RuntimeError, tf.errors.OpError) as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise SettingsError(f"{flag}={address}: no TPU reached ({reason}); give the TPU's name as `gcloud compute "
                                f"tpus list` shows it (with --tpu_zone and --gcp_project off Google Cloud's VMs), or "
                                f"its grpc:// address") from None
        strategy = tf.distribute.TPUStrategy(resolver)
        if "num_tpu_cores" in settings.given_settings() and strategy.num_replicas_in_sync != settings.num_tpu_cores:
            raise SettingsError(f"--num_tpu_cores={settings.num_tpu_cores}, but the TPU has "
                                f"{strategy.num_replicas_in_sync} cores")
        return strategy
    return tf.distribute.get_strategy()
