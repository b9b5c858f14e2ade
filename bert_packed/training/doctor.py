"""The install, checked: TensorFlow's build, the devices it sees, XLA, bf16, and packed training.

Each check returns Findings: what was found and, for a problem, its fix in one line. The last
check trains: a few packed updates of a tiny model on the first device (the first GPU, else the
CPU), held to the same updates on the same sequences one a row (packed == unpacked: the block-
diagonal mask, the per-sequence positions and losses, on this device's kernels).

same_sequences_packed_or_not() builds the packed and one-a-row batches of the same random
sequences for that check and for scripts/device_check.py.
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile

import numpy as np
import tensorflow as tf

from bert_packed.features import Shapes, model_features
from bert_packed.model import BertConfig
from bert_packed.packing import packer
from bert_packed.training.config import make_config
from bert_packed.training.data import TrainData
from bert_packed.training.process import set_up_process
from bert_packed.training.step_pool import StepPool, pool_or_own

# The TensorFlow this project is built for, and the CUDA it was built with (tensorflow[and-cuda]).
TENSORFLOW = "2.21"
GPU_INSTALL = "pip install 'tensorflow[and-cuda]==2.21.*' (or pip install -e '.[gpu]' in this checkout)"
# bf16 tensor cores: compute capability 8.0 (A100) and later.
BF16_CAPABILITY = (8, 0)
# What the packed updates must agree to, float32 with TensorFloat-32 off (other row counts reduce in
# another order): the distance between the two layouts' weights after the updates, relative to the
# distance they moved, over all weights at once. Not element by element: an element whose gradient
# is rounding noise, as LayerNorm's and the biases' can be, takes LAMB's size-normalised step
# (epsilon damps it) with a sign of its own in each layout; that was up to 2e-4 of the largest
# change on this project's CPU with nothing wrong. Over all weights, 1e-7 to 3e-6 here; a mask that
# lets attention cross sequences, 5e-2 and more.
PACKED_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class Finding:
    """One line of the report: what a check found; `fix` is set when it is a problem."""

    check: str
    found: str
    fix: str | None = None


def same_sequences_packed_or_not(shapes: Shapes, count: int, vocab_size: int, seed: int = 0,
                                 min_length: int = 8) -> tuple[dict, dict]:
    """(packed, one-a-row) batches of the same `count` random sequences, as the model reads them.

    The sequences ([CLS] first, 15% of their tokens predicted, two segments) are `min_length` to
    L / S long, so that S of them fill a pack; pack k holds sequences k*S .. k*S + S - 1. Both
    layouts have L tokens a row and P + S prediction slots.

    Args:
      shapes: L, P and S.
      count: sequences, a multiple of S.
      vocab_size: token ids are drawn below it.

    Returns:
      Two {model key: int32 tf.Tensor} dicts: count / S packs, and count rows.
    """
    rng = np.random.default_rng(seed)
    length, depth = shapes.max_seq_length, shapes.max_sequences_per_pack
    rows = np.zeros(count, dtype=packer.row_dtype(shapes.unpacked()))
    rows["length"] = rng.integers(min_length, length // depth + 1, count)
    rows["num_predictions"] = np.clip(np.round(rows["length"] * 0.15), 1, shapes.max_predictions_per_seq)
    rows["next_sentence_label"] = rng.integers(0, 2, count)
    for i, row in enumerate(rows):
        n, p = int(row["length"]), int(row["num_predictions"])
        rows["input_ids"][i, :n] = rng.integers(5, vocab_size, n)
        rows["segment_ids"][i, n // 2:n] = 1
        rows["masked_lm_positions"][i, :p] = np.sort(rng.choice(np.arange(1, n), p, replace=False))
        rows["masked_lm_ids"][i, :p] = rng.integers(5, vocab_size, p)
    as_tensors = lambda packs: {k: tf.constant(v) for k, v in model_features(packs).items()}
    packed = packer.assemble_packs(rows, np.arange(count) // depth, np.arange(count) % depth, count // depth, shapes)
    one_a_row = packer.assemble_packs(rows, np.arange(count), np.zeros(count, int), count, shapes)
    return as_tensors(packed), as_tensors(one_a_row)


def tensorflow_build() -> list[Finding]:
    """TensorFlow's version and what it was built with."""
    build = tf.sysconfig.get_build_info()
    findings = [Finding("TensorFlow", f"{tf.__version__}" + (
        f", built with CUDA {build.get('cuda_version')} and cuDNN {build.get('cudnn_version')}"
        if build.get("is_cuda_build") else ", a CPU build (no CUDA)"))]
    if not tf.__version__.startswith(TENSORFLOW + "."):
        findings.append(Finding("TensorFlow version", tf.__version__,
                                f"this project is built and tested on TensorFlow {TENSORFLOW}: {GPU_INSTALL}"))
    return findings


def driver_gpus() -> list[str]:
    """The GPUs the NVIDIA driver lists (nvidia-smi), with the driver's version; [] without it."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no nvidia-smi: no NVIDIA driver
        return []
    # A GPU's line holds its three fields; "No devices were found" is no GPU.
    return [line.strip() for line in listed.stdout.splitlines() if line.count(",") == 2] if listed.returncode == 0 else []


def gpus() -> list[Finding]:
    """The GPUs TensorFlow sees (name, compute capability, memory), or why it sees none."""
    from tensorflow.python.client import device_lib

    memory = {d.name.split("device:")[-1]: d.memory_limit for d in device_lib.list_local_devices()
              if d.device_type == "GPU"}
    seen = tf.config.list_physical_devices("GPU")
    findings = []
    for index, device in enumerate(seen):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        found = (f"{details.get('device_name', 'GPU')}, compute capability {'.'.join(map(str, capability or ()))}, "
                 f"{memory.get(f'GPU:{index}', 0) / 2**30:.1f} GiB for TensorFlow")
        findings.append(Finding(f"GPU:{index}", found))
    if seen:
        return findings
    listed = driver_gpus()
    build = tf.sysconfig.get_build_info()
    if listed and not build.get("is_cuda_build"):
        return [Finding("GPUs", f"the driver lists {len(listed)} ({listed[0]}); this TensorFlow is a CPU build",
                        f"install the GPU build beside nothing else: pip uninstall tensorflow-cpu, then {GPU_INSTALL}")]
    if listed:
        return [Finding("GPUs", f"the driver lists {len(listed)} ({listed[0]}); TensorFlow sees none",
                        f"TensorFlow {TENSORFLOW} needs CUDA 12 libraries (the and-cuda extra: {GPU_INSTALL}) and a driver "
                        f"of version 525 or later; check CUDA_VISIBLE_DEVICES")]
    return [Finding("GPUs", "none: no NVIDIA driver found (nvidia-smi); this machine trains on its CPU")]


def first_device() -> str:
    """The device the checks run on: the first GPU, else the CPU."""
    return "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"


def xla(device: str) -> list[Finding]:
    """Whether XLA compiles and runs on `device` (--xla)."""
    try:
        with tf.device(device):
            tf.function(lambda x: tf.reduce_sum(tf.nn.gelu(x @ x)), jit_compile=True)(tf.ones([64, 64])).numpy()
        return [Finding("XLA", f"compiles and runs on {device}")]
    except (tf.errors.OpError, RuntimeError, ValueError) as e:
        return [Finding("XLA", f"fails on {device}: {str(e).splitlines()[0][:200]}",
                        "XLA on a GPU needs CUDA's ptxas and libdevice: the and-cuda extra brings them "
                        f"({GPU_INSTALL}); or train without --xla")]


def bf16(device: str) -> list[Finding]:
    """Whether bf16 matrix products run on `device`, and whether they are fast there (--precision=bf16)."""
    if device.startswith("/GPU"):
        capability = tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[0]).get("compute_capability") or (0, 0)
        if tuple(capability) < BF16_CAPABILITY:
            return [Finding("bf16", f"compute capability {'.'.join(map(str, capability))}: no bf16 tensor cores",
                            "use --precision=fp16 (dynamic loss scaling) on this GPU")]
    try:
        with tf.device(device):
            tf.matmul(tf.ones([16, 16], tf.bfloat16), tf.ones([16, 16], tf.bfloat16)).numpy()
    except (tf.errors.OpError, RuntimeError) as e:
        return [Finding("bf16", f"fails on {device}: {str(e).splitlines()[0][:200]}", "use --precision=fp32")]
    where = "tensor cores" if device.startswith("/GPU") else "the CPU (slower than float32 on most CPUs)"
    return [Finding("bf16", f"matrix products run on {where}")]


def packed_updates(device: str, updates: int = 3, steps: StepPool | None = None) -> list[Finding]:
    """A few LAMB updates of a tiny model on packed rows and on the same sequences one a row, on
    `device`, through the trainer's compiled step: the weights must agree. `steps`: the caller's
    StepPool (a process that runs the doctor more than once compiles its two steps once)."""
    bert = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    shapes = Shapes(64, 8, 3)
    packed, one_a_row = same_sequences_packed_or_not(shapes, 12, bert.vocab_size)
    pool = pool_or_own(steps)
    tensor_float_32 = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)  # float32 products round alike in both layouts
    try:
        with tempfile.TemporaryDirectory() as work, tf.device(device):
            weights, losses, start = {}, {}, None
            for mode, features in (("packed", packed), ("padded", one_a_row)):
                config = make_config(bert=bert, input_mode=mode, train_batch_size=int(features["input_ids"].shape[0]),
                                     num_train_steps=updates, learning_rate=1e-3, output_dir=work, seed=1)
                set_up_process(config)
                data = TrainData(shapes=shapes, input_mode=mode, packing_factor=3.0 if mode == "packed" else 1.0)
                with pool.holding(config, data) as step:
                    if start is None:
                        start = [w.numpy() for w in step.model.weights]
                    else:  # the same start: the packed step's first weights
                        for variable, value in zip(step.model.weights, start):
                            variable.assign(value)
                    sums = step.run_updates(iter(tf.data.Dataset.from_tensors(features).repeat()), updates)
                    losses[mode] = sums[:, 1] / sums[:, 2]  # the MLM loss of each update
                    weights[mode] = [w.numpy() for w in step.model.weights]
    except (tf.errors.OpError, RuntimeError) as e:
        return [Finding("packed training", f"fails on {device}: {str(e).splitlines()[0][:200]}",
                        "run with --verbosity=1 to see TensorFlow's error in full")]
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tensor_float_32)
    return [weights_agree(weights["packed"], weights["padded"], start, f"{updates} updates on {device}", losses["packed"])]


def weights_agree(packed: list[np.ndarray], padded: list[np.ndarray], start: list[np.ndarray], what: str,
                  losses: np.ndarray) -> Finding:
    """The packed-training finding: the packed and one-a-row weights after `what` (the updates
    on a device), against the weights they started from; `losses`, the packed run's MLM losses."""
    packed, padded, start = (np.concatenate([w.ravel() for w in ws]) for ws in (packed, padded, start))
    moved = np.linalg.norm(packed - start)
    finite = np.isfinite(packed).all() and np.isfinite(padded).all()
    if not finite or moved == 0:
        return Finding("packed training", f"{what}: the weights {'did not move' if finite else 'are not finite'}",
                       "this device does not train; report it with this line")
    difference = np.linalg.norm(packed - padded) / moved
    found = (f"{what}: packed and one-a-row weights agree to {difference:.1e} of their change "
             f"(MLM loss {losses[0]:.3f} -> {losses[-1]:.3f})")
    if difference > PACKED_TOLERANCE:
        return Finding("packed training", found, f"more than {PACKED_TOLERANCE:g}: this device computes packed rows "
                                                 f"wrongly; report it with this line")
    return Finding("packed training", found)


def checks(steps: StepPool | None = None) -> list[Finding]:
    """Every check, in order; the training check runs only when TensorFlow can run at all (on
    compiled steps of `steps`, a StepPool, where given)."""
    findings = tensorflow_build() + gpus()
    device = first_device()
    findings += xla(device) + bf16(device) + packed_updates(device, steps=steps)
    return findings
