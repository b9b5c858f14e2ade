"""The pre-training loop: MLPerf recipe on packed (or padded, or bucketed) data.

One update = `steps_per_update` micro-batches of `train_batch_size` rows each (global, all
replicas). The counts that normalise the losses are summed over the whole update first (they
come from the features alone), so an accumulated or distributed update equals one big batch.

Output directory:
  train_log.jsonl, eval_log.jsonl   one JSON object a line: step, sequences, loss, mlm_accuracy, ...
  mllog.txt                         :::MLLOG lines (mlperf-logging)
  run.json                          input mode, packing factor, batch, seed (for compare_curves)
  tensorboard/                      TensorBoard events
  checkpoints/                      model, optimizer, step and input position; the latest resumes
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os
import shutil
import signal
import time

import keras
import tensorflow as tf

from bert_packed.data.pipeline import PipelineConfig, make_dataset
from bert_packed.data.schema import Shapes
from bert_packed.files import write_text_atomically
from bert_packed.model import BertConfig, BertPretrainingModel, load_google_checkpoint
from bert_packed.training.losses import loss_from_sums, metrics_from_sums, normalizers, pretraining_sums
from bert_packed.training.optimizers import AdamWeightDecay, Lamb, PolynomialWarmup, adjusted_betas


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN or Inf loss, say); the last good checkpoint is kept."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs, as plain values (flags are parsed in bert_packed.cli)."""

    bert_config: BertConfig
    input_files: tuple[str, ...]
    output_dir: str
    eval_files: tuple[str, ...] = ()
    init_checkpoint: str | None = None
    max_seq_length: int = 512
    max_predictions_per_seq: int = 76
    max_sequences_per_pack: int = 1       # of the training data (1: unpacked)
    eval_sequences_per_pack: int = 1      # of the eval data
    input_mode: str = "packed"
    bucket_boundaries: tuple[int, ...] = ()
    train_batch_size: int = 8             # rows (packs when packed) per micro-batch, all replicas
    eval_batch_size: int = 8
    learning_rate: float = 4.25e-4
    num_train_steps: int = 100
    num_warmup_steps: int = 0
    start_warmup_step: int = 0
    steps_per_update: int = 1
    optimizer: str = "lamb"
    beta_1: float = 0.9
    beta_2: float = 0.999
    weight_decay_rate: float = 0.01
    epsilon: float = 1e-6
    packing_factor: float = 1.0           # sequences per row of the training data
    adjust_betas_for_packing: bool = False
    loss_averaging: str = "token"
    save_checkpoints_steps: int = 1000
    seed: int = 12345
    deterministic: bool = False
    precision: str = "fp32"
    xla: bool = False
    target_mlm_accuracy: float = 0.720
    eval_every_samples: int = 0           # 0: never during training, once at the end
    log_every_steps: int = 10
    flags_text: str = ""                 # the command's flags, written to flags.txt once the run is claimed


def make_optimizer(config: TrainConfig):
    """LAMB or AdamW with the reference schedule; betas raised to the packing factor if asked."""
    beta_1, beta_2 = config.beta_1, config.beta_2
    if config.adjust_betas_for_packing:
        beta_1, beta_2 = adjusted_betas(beta_1, beta_2, config.packing_factor)
    schedule = PolynomialWarmup(config.learning_rate, config.num_train_steps, config.num_warmup_steps,
                                config.start_warmup_step)
    kind = {"lamb": Lamb, "adamw": AdamWeightDecay}[config.optimizer]
    optimizer = kind(schedule, beta_1=beta_1, beta_2=beta_2, epsilon=config.epsilon,
                     weight_decay_rate=config.weight_decay_rate)
    if config.precision == "fp16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


class Trainer:
    """Builds the model, data and optimizer under a tf.distribute strategy, and runs the loop."""

    def __init__(self, config: TrainConfig, strategy: tf.distribute.Strategy | None = None):
        self.config = config
        self.strategy = strategy or tf.distribute.get_strategy()
        if config.deterministic:
            keras.utils.set_random_seed(config.seed)
            tf.config.experimental.enable_op_determinism()
        keras.mixed_precision.set_global_policy(
            {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[config.precision])
        # Every worker takes part in saving (it is collective); only the chief writes output_dir.
        self.is_chief, task_id = _chief(self.strategy)
        self.work_dir = config.output_dir if self.is_chief else os.path.join(
            config.output_dir, ".workers", f"worker-{task_id}")
        os.makedirs(self.work_dir, exist_ok=True)
        with self.strategy.scope():
            self.model = BertPretrainingModel(config.bert_config)
            self.model.build()
            self.optimizer = make_optimizer(config)
            self.optimizer.build(self.model.trainable_variables)
            # LAMB or AdamW itself (inside a LossScaleOptimizer with fp16).
            self._loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
            self._base_optimizer = self.optimizer.inner_optimizer if self._loss_scaled else self.optimizer
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.sequences = tf.Variable(0, dtype=tf.int64, trainable=False, name="sequences")
        # The input position is the step: a resumed run skips the batches already used (exact in
        # deterministic mode, and independent of the distribution strategy).
        # Dropout's random state is not among the weights Keras checkpoints: add it, so that a
        # resumed deterministic run draws the same masks as an uninterrupted one.
        seeds = {f"seed_{i}": v.value for i, v in enumerate(
            v for v in self.model.variables if v.path.endswith("seed_generator_state"))}
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step,
                                              sequences=self.sequences, dropout_seeds=seeds)
        self.manager = tf.train.CheckpointManager(self.checkpoint, os.path.join(self.work_dir, "checkpoints"),
                                                  max_to_keep=3)
        self._update = tf.function(self._update_fn)
        self._eval_step = tf.function(self._eval_step_fn)  # built once: evaluations do not retrace
        self._gradients = tf.function(self._gradients_fn, jit_compile=True) if config.xla else self._gradients_fn
        self._stop_requested = False

    # ---- data
    def _pipeline(self, files, shapes, mode, batch_size, is_training):
        return PipelineConfig(tuple(files), shapes, mode, batch_size, is_training, self.config.seed,
                              deterministic=self.config.deterministic,
                              bucket_boundaries=self.config.bucket_boundaries)

    def _train_dataset(self, context):
        c = self.config
        shapes = Shapes(c.max_seq_length, c.max_predictions_per_seq, c.max_sequences_per_pack)
        pipeline = self._pipeline(c.input_files, shapes, c.input_mode, c.train_batch_size, True)
        pipeline = dataclasses.replace(pipeline, skip_batches=int(self.step.numpy()) * c.steps_per_update)
        return make_dataset(pipeline, context)

    def _eval_dataset(self, context):
        c = self.config
        packed = c.eval_sequences_per_pack > 1
        shapes = Shapes(c.max_seq_length, c.max_predictions_per_seq, c.eval_sequences_per_pack)
        return make_dataset(self._pipeline(c.eval_files, shapes, "packed" if packed else "padded",
                                           c.eval_batch_size, False), context)

    # ---- one update
    def _update_fn(self, iterator):
        batches = [next(iterator) for _ in range(self.config.steps_per_update)]
        sums = self.strategy.run(self._replica_update, args=(batches,))
        return {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()}

    def _replica_update(self, batches):
        context = tf.distribute.get_replica_context()
        counts = {}
        for features in batches:
            for name, value in normalizers(features).items():
                counts[name] = counts.get(name, 0.0) + value
        counts = {k: context.all_reduce(tf.distribute.ReduceOp.SUM, v) for k, v in counts.items()}
        variables = self.model.trainable_variables
        gradients, totals = self._gradients(batches, counts)
        # Each replica's loss is divided by the global counts, so the replicas' gradients add up to
        # the global gradient. Keras clips per replica before it all-reduces; MLPerf clips the
        # global gradient. So: all-reduce and clip here, then hand Keras 1/n of the result a
        # replica (its clip is then a no-op, its sum restores the clipped global gradient).
        gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        scale = tf.cast(self.optimizer.dynamic_scale, tf.float32) if self._loss_scaled else 1.0
        gradients, _ = tf.clip_by_global_norm([g / scale for g in gradients], self._base_optimizer.clip_norm)
        share = scale / context.num_replicas_in_sync
        self.optimizer.apply_gradients(zip([g * share for g in gradients], variables))
        return totals

    def _gradients_fn(self, batches, counts):
        """Summed gradients and sums of the micro-batches (XLA-compiled with --xla)."""
        variables = self.model.trainable_variables
        gradients = [tf.zeros_like(v) for v in variables]
        totals = {}
        for features in batches:
            with tf.GradientTape() as tape:
                sums = pretraining_sums(self.model(features, training=True), features)
                loss = loss_from_sums(sums, self.config.loss_averaging, counts)
                if self._loss_scaled:
                    loss = self.optimizer.scale_loss(loss)
            gradients = [g + tf.convert_to_tensor(d) for g, d in zip(gradients, tape.gradient(loss, variables))]
            for name, value in sums.items():
                totals[name] = totals.get(name, 0.0) + value
            totals["tokens"] = totals.get("tokens", 0.0) + tf.reduce_sum(
                tf.cast(features["input_mask"] > 0, tf.float32))
            totals["slots"] = totals.get("slots", 0.0) + tf.cast(tf.size(features["input_mask"]), tf.float32)
        return gradients, totals

    # ---- evaluation
    def evaluate(self) -> dict:
        """Metrics over the whole eval set (packed or unpacked files give the same numbers)."""
        totals = None
        for features in self.strategy.distribute_datasets_from_function(self._eval_dataset):
            sums = self._eval_step(features)
            totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
        return metrics_from_sums(totals, self.config.loss_averaging) if totals else {}

    def _eval_step_fn(self, features):
        def replica(features):
            return pretraining_sums(self.model(features, training=False), features)
        sums = self.strategy.run(replica, args=(features,))
        return {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()}

    # ---- the loop
    def train(self) -> dict:
        """Runs (or resumes) training to num_train_steps or the target accuracy; returns the last metrics."""
        c = self.config
        summary = {"input_mode": c.input_mode, "packing_factor": c.packing_factor,
                   "train_batch_size": c.train_batch_size, "steps_per_update": c.steps_per_update,
                   "loss_averaging": c.loss_averaging, "seed": c.seed, "target_mlm_accuracy": c.target_mlm_accuracy,
                   "bert_config": c.bert_config.to_dict()}
        run_file = os.path.join(self.work_dir, "run.json")
        if os.path.exists(run_file):
            with open(run_file, encoding="utf-8") as f:
                previous = json.load(f)
            changed = sorted(k for k in summary if k in previous and previous[k] != summary[k])
            if changed:
                raise TrainingError(f"{c.output_dir}: holds another run ({', '.join(changed)} differ); use a new "
                                    f"--output_dir, or the same flags to resume it")
        write_text_atomically(run_file, json.dumps(summary, indent=1) + "\n")
        if c.flags_text:
            write_text_atomically(os.path.join(self.work_dir, "flags.txt"), c.flags_text)
        resumed = self.manager.latest_checkpoint
        if resumed:
            try:
                self.checkpoint.restore(resumed).assert_existing_objects_matched()
            except Exception as e:  # noqa: BLE001 - whatever broke, the checkpoint is what to name
                raise TrainingError(f"{resumed}: cannot restore this checkpoint ({str(e).splitlines()[0]}); "
                                    f"remove it to fall back to an older one") from None
            logging.info("resumed from %s at step %d", resumed, int(self.step.numpy()))
            if int(self.step.numpy()) >= c.num_train_steps:
                logging.info("%s: already trained to step %d; nothing to do", c.output_dir, c.num_train_steps)
                with open(os.path.join(self.work_dir, "train_log.jsonl"), encoding="utf-8") as f:
                    return json.loads(f.readlines()[-1])
        elif c.init_checkpoint:
            load_google_checkpoint(self.model, c.init_checkpoint)
            logging.info("initialised from %s", c.init_checkpoint)
        self.train_iterator = iter(self.strategy.distribute_datasets_from_function(self._train_dataset))
        # Steps logged after the checkpoint resumed from are redone: their lines go, and the clocks
        # continue from the checkpoint's.
        last = _keep_logged_steps(self.work_dir, int(self.step.numpy()))
        seconds_before, train_seconds_before = last.get("seconds", 0.0), last.get("train_seconds", 0.0)
        logs = _Logs(self.work_dir)
        logs.last_seconds = seconds_before
        betas = self._base_optimizer
        logs.mllog("run_start" if not resumed else "run_resume", None)
        logs.mllog("opt_lamb_beta_1", betas.beta_1)
        logs.mllog("opt_lamb_beta_2", betas.beta_2)
        logging.info("optimizer %s, betas %.6f / %.6f (packing factor %.3f, adjusted: %s)", c.optimizer,
                     betas.beta_1, betas.beta_2, c.packing_factor, c.adjust_betas_for_packing)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        step, sequences = int(self.step.numpy()), int(self.sequences.numpy())
        next_eval = (sequences // c.eval_every_samples + 1) * c.eval_every_samples if c.eval_every_samples else None
        metrics, start = {}, time.perf_counter()
        try:
            while step < c.num_train_steps:
                learning_rate = float(self.optimizer.learning_rate)
                sums = self._update(self.train_iterator)
                metrics = metrics_from_sums({k: v for k, v in sums.items() if k not in ("tokens", "slots")},
                                            c.loss_averaging)
                if not math.isfinite(metrics["loss"]):
                    raise TrainingError(f"loss is {metrics['loss']} at step {step + 1}; stopped without "
                                        f"saving, the last good checkpoint is {self.manager.latest_checkpoint}")
                step += 1
                sequences += int(metrics["num_sequences"])
                self.step.assign(step)
                self.sequences.assign(sequences)
                elapsed = time.perf_counter() - start
                seconds = seconds_before + elapsed
                record = {"step": step, "sequences": sequences, "learning_rate": learning_rate,
                          "seconds": seconds,
                          "train_seconds": train_seconds_before + elapsed - logs.eval_seconds,
                          "real_tokens": float(sums["tokens"]),
                          "padding_efficiency": float(sums["tokens"] / sums["slots"]), **metrics}
                logs.train(record)
                if step % c.log_every_steps == 0 or step == c.num_train_steps:
                    logging.info("step %d: loss %.4f, mlm accuracy %.4f, %d sequences (%.1f/s, %.0f real tokens/s, "
                                 "padding efficiency %.1f%%)", step, metrics["loss"], metrics["mlm_accuracy"],
                                 sequences, metrics["num_sequences"] / max(seconds - logs.last_seconds, 1e-9),
                                 float(sums["tokens"]) / max(seconds - logs.last_seconds, 1e-9),
                                 100 * record["padding_efficiency"])
                logs.last_seconds = seconds
                if step % c.save_checkpoints_steps == 0:
                    self._save()
                if next_eval is not None and sequences >= next_eval and c.eval_files:
                    next_eval += c.eval_every_samples
                    if self._evaluate_and_log(logs, step, seconds):
                        break
                if self._stop_requested:
                    self._save()
                    logging.warning("SIGTERM: saved step %d; run again with the same output_dir to resume", step)
                    return metrics
            self._save()
            if c.eval_files and not c.eval_every_samples:
                self._evaluate_and_log(logs, step, seconds_before + time.perf_counter() - start)
            logs.mllog("run_stop", None, {"status": "success" if logs.reached else "aborted"})
        finally:
            signal.signal(signal.SIGTERM, previous)
            logs.close()
        return metrics

    def _evaluate_and_log(self, logs, step, seconds) -> bool:
        start = time.perf_counter()
        metrics = self.evaluate()
        logs.eval_seconds += time.perf_counter() - start
        sequences = int(self.sequences.numpy())
        record = {"step": step, "sequences": sequences, "seconds": seconds, **metrics}
        logs.eval(record)
        logs.mllog("eval_accuracy", metrics.get("mlm_accuracy", 0.0), {"epoch_num": sequences})
        logging.info("eval at step %d (%d sequences): mlm accuracy %.4f, loss %.4f", step, sequences,
                     metrics.get("mlm_accuracy", 0.0), metrics.get("loss", 0.0))
        if metrics.get("mlm_accuracy", 0.0) >= self.config.target_mlm_accuracy:
            logs.reached = True
            logging.info("target mlm accuracy %.3f reached at step %d after %d sequences",
                         self.config.target_mlm_accuracy, step, sequences)
            return True
        return False

    def _save(self) -> None:
        """Saves the current step unless it is the latest checkpoint already."""
        step = int(self.step.numpy())
        latest = self.manager.latest_checkpoint
        if latest is None or not latest.endswith(f"-{step}"):
            try:
                self.manager.save(checkpoint_number=step)
            except Exception:
                # A failed save (a full disk) leaves TensorFlow's temporary files behind.
                for path in glob.glob(os.path.join(self.manager.directory, f"ckpt-{step}_temp*")):
                    shutil.rmtree(path, ignore_errors=True)
                raise

    def _on_sigterm(self, signum, frame):
        self._stop_requested = True


def _keep_logged_steps(directory: str, step: int) -> dict:
    """Drops the train and eval log lines after `step`; returns the last train record kept."""
    last = {}
    for name in ("train_log.jsonl", "eval_log.jsonl"):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        write_text_atomically(path, "".join(lines))
        if name == "train_log.jsonl" and lines:
            last = json.loads(lines[-1])
    return last


def _chief(strategy) -> tuple[bool, int]:
    """(whether this process is the chief, its task index) under multi-worker training."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True, 0
    cluster = resolver.cluster_spec().as_dict()
    if "chief" in cluster:
        return resolver.task_type == "chief", resolver.task_id or 0
    return resolver.task_type == "worker" and resolver.task_id == 0, resolver.task_id or 0


class _Logs:
    """train_log.jsonl, eval_log.jsonl, TensorBoard and :::MLLOG lines, appended on resume."""

    def __init__(self, output_dir: str):
        from mlperf_logging import mllog

        self.train_file = open(os.path.join(output_dir, "train_log.jsonl"), "a", encoding="utf-8")
        self.eval_file = open(os.path.join(output_dir, "eval_log.jsonl"), "a", encoding="utf-8")
        self.writer = tf.summary.create_file_writer(os.path.join(output_dir, "tensorboard"))
        mllog.config(filename=os.path.join(output_dir, "mllog.txt"))
        self.mllogger = mllog.get_mllogger()
        self.last_seconds = 0.0
        self.eval_seconds = 0.0  # of this process: train_seconds = seconds - eval_seconds
        self.reached = False

    def train(self, record: dict) -> None:
        self.train_file.write(json.dumps(record) + "\n")
        self.train_file.flush()
        with self.writer.as_default(step=record["step"]):
            for name in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate"):
                tf.summary.scalar(f"train/{name}", record[name])

    def eval(self, record: dict) -> None:
        self.eval_file.write(json.dumps(record) + "\n")
        self.eval_file.flush()
        with self.writer.as_default(step=record["step"]):
            for name in ("loss", "mlm_accuracy", "nsp_accuracy"):
                tf.summary.scalar(f"eval/{name}", record.get(name, 0.0))

    def mllog(self, key, value, metadata=None) -> None:
        self.mllogger.event(key=key, value=value, metadata=metadata)

    def close(self) -> None:
        self.train_file.close()
        self.eval_file.close()
        self.writer.close()
