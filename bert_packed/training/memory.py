"""A training step's memory, planned before it compiles: bytes = fixed + rows x per_row.

What one replica holds at the peak of a training step:
  - the compiled step (XLA's program of update.Update._gradients): the weights it reads, the
    gradients it writes, and its temporaries, among which the activations the backward pass
    needs. XLA's buffer assignment gives these bytes exactly for one shape; measured at several
    row counts (1, 2 and 4; BERT-Large also 32 and 56), a line `fixed + rows x per_row` that is
    never below a measurement (scripts/benchmark_memory.py) is kept with the code in
    resources/memory_plan.json for each model, L, precision and recompute mode;
  - the optimizer: LAMB's two moments (float32, a weight each) and, while the update averages,
    clips and applies them, one more copy of the gradients and the working copies of the largest
    weight (optimizer_bytes: counted from the model, not measured).
A length between two measured ones takes per_row = a L + b L^2 (the projections grow with L, the
[L, L] attention tensors with L^2) through the two, and a vocabulary other than the measured
one changes `fixed` by its weights' bytes (a float32 weight, its gradient and two moments).

Only the shapes XLA compiles are planned: eager or tf.function steps without --xla keep more and
are not checked. A micro-batch fits when its estimate leaves HEADROOM of the device's memory free
(the allocator's fragmentation, cuBLAS and NCCL workspaces).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os

from bert_packed.errors import SettingsError
from bert_packed.model.config import BertConfig
from bert_packed.storage import files
from bert_packed.training.batching import batching
from bert_packed.training.config import TrainConfig

PLAN_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resources",
                         "memory_plan.json")
# The share of the device's memory kept free by the plan.
HEADROOM = 0.05
GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Measured:
    """One configuration's compiled step, measured (a line of memory_plan.json).

    Attributes:
      model: the BERT config's sizes: hidden_size, num_hidden_layers, num_attention_heads,
        intermediate_size, vocab_size.
      max_seq_length: L.
      precision: "fp32", "bf16" or "fp16".
      recompute: one of model.RECOMPUTE.
      fixed_bytes, per_row_bytes: the compiled step's bytes = fixed + rows x per_row.
      measured_by: how (XLA's buffer assignment, on which backend).
    """

    model: dict
    max_seq_length: int
    precision: str
    recompute: str
    fixed_bytes: int
    per_row_bytes: int
    measured_by: str


MODEL_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def model_sizes(bert: BertConfig) -> dict:
    """The sizes that key a plan (the vocabulary is corrected for, not keyed)."""
    return {name: getattr(bert, name) for name in MODEL_SIZES}


@functools.cache
def read_plan(path: str = PLAN_FILE) -> tuple[Measured, ...]:
    """The measured configurations kept with the code (none when the file is not there: nothing
    is then checked)."""
    if not files.exists(path):
        return ()
    with files.open_file(path) as f:
        return tuple(Measured(**entry) for entry in json.load(f)["measured"])


def parameter_count(bert: BertConfig, next_sentence_prediction: bool = True) -> int:
    """The model's weights, counted as BertPretrainingModel holds them.

    >>> parameter_count(BertConfig())  # BERT-Large
    336226108
    """
    hidden, intermediate = bert.hidden_size, bert.intermediate_size
    embeddings = (bert.vocab_size + bert.max_position_embeddings + bert.type_vocab_size + 2) * hidden
    layer = 4 * hidden * hidden + 4 * hidden + 2 * hidden * intermediate + intermediate + hidden + 4 * hidden
    heads = hidden * hidden + 3 * hidden + bert.vocab_size
    if next_sentence_prediction:
        heads += hidden * hidden + hidden + 2 * hidden + 2
    return embeddings + bert.num_hidden_layers * layer + heads


def optimizer_bytes(bert: BertConfig) -> int:
    """What the optimizer holds beside the compiled step: two float32 moments a weight, one more
    float32 copy of the gradients while they are averaged, clipped and applied, and four working
    copies of the largest weight (the word embeddings) inside LAMB's update."""
    largest = bert.vocab_size * bert.hidden_size
    return 4 * (3 * parameter_count(bert) + 4 * largest)


def step_bytes(bert: BertConfig, max_seq_length: int, precision: str, recompute: str, rows: int,
               plan: tuple[Measured, ...] | None = None) -> int | None:
    """A replica's bytes for a micro-batch of `rows` rows of `max_seq_length` (module docstring);
    None when the plan has no measurement of this model, precision and recompute mode at this L
    or at two lengths around it."""
    fixed, per_row = step_line(bert, max_seq_length, precision, recompute, plan)
    if fixed is None:
        return None
    return fixed + rows * per_row


def step_line(bert: BertConfig, max_seq_length: int, precision: str, recompute: str,
              plan: tuple[Measured, ...] | None = None) -> tuple[int | None, int | None]:
    """(fixed, per_row) of a replica's bytes, the optimizer's included; (None, None) when unplanned."""
    sizes = model_sizes(bert)
    measured = sorted((m for m in (read_plan() if plan is None else plan)
                       if {k: m.model[k] for k in MODEL_SIZES} == sizes and m.precision == precision
                       and m.recompute == recompute), key=lambda m: m.max_seq_length)
    exact = [m for m in measured if m.max_seq_length == max_seq_length]
    if exact:
        line = exact[0]
        fixed, per_row = line.fixed_bytes, line.per_row_bytes
    else:
        below = [m for m in measured if m.max_seq_length < max_seq_length]
        above = [m for m in measured if m.max_seq_length > max_seq_length]
        if not below or not above:
            return None, None
        line, other = below[-1], above[0]
        fixed, per_row = _between(line, other, max_seq_length)
    fixed += 16 * (bert.vocab_size - line.model["vocab_size"]) * bert.hidden_size
    return fixed + optimizer_bytes(bert), per_row


def _between(short: Measured, long: Measured, length: int) -> tuple[int, int]:
    """(fixed, per_row) at `length` between two measured lengths: fixed linear in L, per_row =
    a L + b L^2 through both."""
    l1, l2 = short.max_seq_length, long.max_seq_length
    b = (long.per_row_bytes / l2 - short.per_row_bytes / l1) / (l2 - l1)
    a = short.per_row_bytes / l1 - b * l1
    fixed = short.fixed_bytes + (long.fixed_bytes - short.fixed_bytes) * (length - l1) / (l2 - l1)
    return round(fixed), round(a * length + b * length * length)


def largest_rows(bert: BertConfig, max_seq_length: int, precision: str, recompute: str, device_bytes: int,
                 plan: tuple[Measured, ...] | None = None) -> int | None:
    """The most rows a replica can hold within device_bytes less HEADROOM (0: not even one);
    None when unplanned."""
    fixed, per_row = step_line(bert, max_seq_length, precision, recompute, plan)
    if fixed is None:
        return None
    return max(0, int((device_bytes * (1 - HEADROOM) - fixed) // per_row))


def check_micro_batch(config: TrainConfig, train_data, num_replicas: int, device_bytes: int, device_name: str,
                      plan: tuple[Measured, ...] | None = None) -> str | None:
    """Refuses a micro-batch whose rows cannot fit one replica's device.

    Args:
      config: the run's settings (the model, precision, recompute; the flags the advice changes).
      train_data: the run's TrainData (its input mode, packing factor and shapes).
      num_replicas: replicas sharing a micro-batch.
      device_bytes, device_name: one replica's device memory and its name.
      plan: the measurements (default: read_plan()).

    Returns:
      A line for the log: what the micro-batch needs and the device has; None when unplanned.

    Raises:
      SettingsError: the rows do not fit, naming the largest micro-batch that does and the flags
        that keep the batch and the run's updates.
    """
    bert, precision, recompute = config.model.bert, config.model.precision, config.model.recompute
    length = train_data.shapes.max_seq_length

    def rows_a_replica(train_batch_size: int) -> int | None:
        """A replica's rows at this --train_batch_size, as the run makes them (None: not a batch it takes)."""
        batch = dataclasses.replace(config.batch, train_batch_size=train_batch_size)
        try:
            made = batching(dataclasses.replace(config, batch=batch), train_data.input_mode, train_data.packing_factor,
                            train_data.shapes.max_sequences_per_pack, num_replicas)
        except SettingsError:
            return None
        return made.rows_per_micro_batch // num_replicas

    per_replica = rows_a_replica(config.batch.train_batch_size)
    needed = step_bytes(bert, length, precision, recompute, per_replica, plan)
    if needed is None:
        return None
    rows_need = f"{per_replica} rows of {length} a replica need" if per_replica != 1 else f"1 row of {length} needs"
    said = (f"{rows_need} about {needed / GIB:.1f} GiB with "
            f"--recompute={recompute} ({precision}); {device_name} has {device_bytes / GIB:.1f} GiB")
    if needed <= device_bytes * (1 - HEADROOM):
        return f"memory: {said}, {HEADROOM:.0%} of it kept free"
    fitting = largest_rows(bert, length, precision, recompute, device_bytes, plan)
    batch = config.batch.train_batch_size
    # The fewest micro-batches an update's batch splits into evenly whose rows fit.
    split = next((k for k in range(2, batch + 1) if batch % k == 0
                  and (rows_a_replica(batch // k) or fitting + 1) <= fitting), None) if fitting else None
    advice = [accumulation_flags(config, split)] if split else []
    for other in ("attention", "layer"):
        if other != recompute and (largest_rows(bert, length, precision, other, device_bytes, plan) or 0) >= per_replica:
            advice.append(f"or --recompute={other} fits {per_replica} row{'s' if per_replica != 1 else ''}")
            break
    fits = (f"at most {fitting} rows fit" if fitting > 1 else "at most 1 row fits") if fitting else "not even one row fits"
    raise SettingsError(f"--train_batch_size={batch}: {said}, less {HEADROOM:.0%} kept free; {fits}"
                        + (": " + ", ".join(advice) if advice else "") + " (docs/launch.md#memory)")


def accumulation_flags(config: TrainConfig, split: int) -> str:
    """The flags that split each micro-batch into `split`, keeping an update's batch and the run's
    updates: steps count micro-steps (the reference's), so the step counts grow by `split` too.
    (With --adjust_batch_for_packing, --train_batch_size counts unpacked rows: the same split.)

    >>> from bert_packed.training.config import make_config
    >>> print(accumulation_flags(make_config(bert=BertConfig(), train_batch_size=448, num_train_steps=6700,
    ...                                      num_warmup_steps=100, output_dir="run"), 2).replace(" keep", "\\n keep"))
    --train_batch_size=224 --steps_per_update=2 --num_train_steps=13400 --num_warmup_steps=200
     keep the 448 rows an update and the 6700 updates
    """
    batch, optimizer = config.batch, config.optimizer
    flags = [f"--train_batch_size={batch.train_batch_size // split}",
             f"--steps_per_update={batch.steps_per_update * split}",
             f"--num_train_steps={optimizer.num_train_steps * split}"]
    flags += [f"--{name}={getattr(optimizer, name) * split}" for name in ("num_warmup_steps", "start_warmup_step")
              if getattr(optimizer, name)]
    return (f"{' '.join(flags)} keep the {batch.train_batch_size * batch.steps_per_update} rows an update and the "
            f"{optimizer.num_train_steps // batch.steps_per_update} updates")


def device_memory(strategy) -> tuple[int, str] | None:
    """(bytes, name) of the smallest GPU the strategy's replicas run on, as TensorFlow's allocator
    may use it; None when they run on no GPU (a CPU, a TPU)."""
    import tensorflow as tf
    from tensorflow.python.client import device_lib

    if not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy():
        used = {"GPU:0"}  # the default strategy (it names no devices): TensorFlow places on the first GPU
    else:
        used = {device.split("/")[-1].replace("device:", "").upper() for device in strategy.extended.worker_devices}
    gpus = [(device.memory_limit, device.physical_device_desc) for device in device_lib.list_local_devices()
            if device.device_type == "GPU" and device.name.split("/")[-1].replace("device:", "").upper() in used]
    if not gpus:
        return None
    memory, description = min(gpus)
    name = next((part.split(": ", 1)[1] for part in description.split(", ") if part.startswith("name: ")), "GPU")
    return memory, name


def check_replica_memory(config: TrainConfig, train_data, strategy) -> None:
    """At the start of a run on GPUs, before anything compiles: refuses a micro-batch whose rows
    cannot fit a replica's device (check_micro_batch), and logs what it needs. Steps without
    --xla, devices that are no GPU and models the plan has not measured are not checked.

    Args:
      train_data: the run's TrainData (its input mode, packing factor and shapes).
      strategy: the run's tf.distribute strategy.
    """
    device = device_memory(strategy) if config.model.xla else None
    if device is None:
        return
    line = check_micro_batch(config, train_data, strategy.num_replicas_in_sync, *device)
    logging.info(line or f"memory: no plan for this BERT config at L={train_data.shapes.max_seq_length} "
                         f"({config.model.precision}, --recompute={config.model.recompute}): the micro-batch is not "
                         f"checked against the device (scripts/benchmark_memory.py measures one)")
