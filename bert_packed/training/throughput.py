"""Training throughput, packed against padded, measured so that a shared machine's noise cannot flip it.

Two runs' wall clocks are a poor speed-up measurement: on a shared machine a neighbour's job can
slow one run and not the other. Here every input mode trains in the same process, and the modes
take turns: round r times `updates` updates of each mode, in the order A B in even rounds and B A
in odd ones, so a slow drift of the machine's speed falls on both. Each round gives one speed-up
(its own A and B); the median is reported with the range, and a range that reaches 1.0 says the
noise is as large as the effect.

Model FLOPs count the useful work only (real tokens, not padding), as MFU does:
  per token and layer    forward 8 H^2 + 4 H I (projections and feed-forward) + 4 H n (attention,
                         n the length of the token's own sequence, here the mean real length)
  per masked prediction  forward 2 H^2 + 2 H V (MLM transform and decoder)
  training               3 x forward (the backward pass costs two forwards)
"""

from __future__ import annotations

import dataclasses
import time

from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.model import BertConfig
from bert_packed.training.cards import bf16_peak_tflops
from bert_packed.training.config import TrainConfig, make_config
from bert_packed.training.data import TrainData, train_pipeline
from bert_packed.training.step_pool import StepPool, pool_or_own


def device_and_peak() -> tuple[str, float | None]:
    """The first GPU's name and its bf16 peak in TFLOP/s (None when unknown), or the CPU."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU", None
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    return name, bf16_peak_tflops(name)


def training_flops(bert: BertConfig, tokens: float, sequences: float, predictions: float) -> float:
    """Model FLOPs of one training pass over `tokens` real tokens in `sequences` sequences.

    For example, the tiny config (H=128, I=512, 2 layers, V=30522) on one sequence of 100 tokens
    with 15 predictions: 3 * (100 * 2 * (8*128^2 + 4*128*512 + 4*128*100) + 15 * (2*128^2 + 2*128*30522))
    = 3 * (100 * 2 * 444,416 + 15 * 7,846,400) = 619.7 MFLOPs.
    """
    hidden, intermediate = bert.hidden_size, bert.intermediate_size
    mean_length = tokens / max(sequences, 1.0)
    per_token = bert.num_hidden_layers * (8 * hidden**2 + 4 * hidden * intermediate + 4 * hidden * mean_length)
    per_prediction = 2 * hidden**2 + 2 * hidden * bert.vocab_size
    return 3.0 * (tokens * per_token + predictions * per_prediction)


def benchmark_run(bert: BertConfig, files: list[str], shapes: Shapes, input_mode: str, batch_size: int,
                  output_dir: str, precision: str = "fp32", xla: bool = False, bucket_boundaries: tuple[int, ...] = (),
                  plan=None) -> tuple[TrainConfig, TrainData]:
    """A run for throughput alone (measure_alternately): LAMB at a small learning rate, no
    checkpoints or evaluations, and its data. With input_mode "packed_online", `plan` (a
    PackingPlan of the files' histogram) guides the packer and gives the packing factor."""
    config = make_config(bert=bert, precision=precision, xla=xla, input_mode=input_mode, train_batch_size=batch_size,
                         bucket_boundaries=bucket_boundaries, learning_rate=1e-4, num_train_steps=10**9,
                         output_dir=output_dir, save_checkpoints_steps=10**9, log_every_steps=10**9)
    online = dict(strategies=plan.strategies, packing_factor=plan.packing_factor) if plan is not None else {}
    data = TrainData(shapes, input_mode, Dataset(tuple(files), ()), **online)
    return config, data


class Measured:
    """One mode of a throughput measurement: its compiled step (of `objective`: pre-training unless
    given; from `steps`, the caller's StepPool, where given, until release()) and an endless
    iterator of its batches, in the same order run after run: the real tokens a row of the
    batches timed (the speed-up packing promises them) is a figure that reproduces."""

    def __init__(self, config: TrainConfig, data: TrainData, objective=None, steps: StepPool | None = None):
        self.pool = pool_or_own(steps)
        self.step = self.pool.take(config, data, objective=objective)
        pipeline = dataclasses.replace(train_pipeline(data, config, self.step.batching), deterministic=True)
        self.iterator = self.step.train_iterator(pipeline)

    def run_updates(self, updates: int):
        return self.step.run_updates(self.iterator, updates)

    def release(self) -> None:
        """The step back to its pool, for the next run of its shape."""
        self.pool.release(self.step)


def measure_alternately(trainers: dict[str, Measured], rounds: int, updates: int) -> dict:
    """Times `updates` updates of each trainer per round, alternating their order.

    Args:
      trainers: name -> Measured; the first is the baseline of the speed-ups.
      rounds: measured rounds, after one untimed round that compiles and warms the pipelines.
      updates: updates per trainer and round.

    Returns:
      {"rounds", "updates", "baseline": the first name, "modes": {name: {"sequences_per_second": [per round],
      "real_tokens_per_second", "flops_per_second", "padding_efficiency"}}, "speedups": {name: [per round,
      against the baseline, in sequences/s]}, "token_speedups": {the same in real tokens/s: the figure to quote when the modes'
      rounds may hold sequences of other lengths}}.
    """
    names = list(trainers)
    for trainer in trainers.values():
        trainer.run_updates(updates)
    modes = {name: {"sequences_per_second": [], "real_tokens_per_second": [], "flops_per_second": [],
                    "padding_efficiency": []} for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            trainer = trainers[name]
            start = time.perf_counter()
            rows = trainer.run_updates(updates)
            seconds = time.perf_counter() - start
            sums = {key: float(rows[:, 1 + i].sum()) for i, key in enumerate(trainer.step.update.sum_keys)}
            sequences = sums[trainer.step.objective.sequences_key]
            flops = training_flops(trainer.step.config.model.bert, sums["tokens"], sequences,
                                   sums.get("mlm_predictions", 0.0))
            mode = modes[name]
            mode["sequences_per_second"].append(sequences / seconds)
            mode["real_tokens_per_second"].append(sums["tokens"] / seconds)
            mode["flops_per_second"].append(flops / seconds)
            mode["padding_efficiency"].append(sums["tokens"] / sums["slots"])
    ratios = {key: {name: [rate / reference for rate, reference in zip(modes[name][key], modes[names[0]][key])]
                    for name in names} for key in ("sequences_per_second", "real_tokens_per_second")}
    return {"rounds": rounds, "updates": updates, "baseline": names[0], "modes": modes,
            "speedups": ratios["sequences_per_second"], "token_speedups": ratios["real_tokens_per_second"]}
