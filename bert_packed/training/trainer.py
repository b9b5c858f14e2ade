"""The pre-training loop: MLPerf recipe on packed (or padded, or bucketed) data.

Steps are the reference's micro-steps: one update is `steps_per_update` micro-batches of
`batch_size` rows each (global, all replicas), and `iterations_per_loop` micro-steps run in one
compiled call with no host reads inside; logs, checks, checkpoints and evaluations happen between
calls.

Gradient clipping, two orders (both allowed by the MLPerf rules):
  after the all-reduce  the counts that normalise the losses are summed over the whole update
                        first (they come from the features alone), the gradients are summed over
                        micro-batches and replicas, and that one gradient is clipped: the update
                        of one big batch.
  before (reference)    each replica clips the gradient of each of its micro-batches (its loss
                        normalised by its own counts), and the update averages them.

Output directory:
  train_log.jsonl, eval_log.jsonl   one JSON object a line: step, sequences, loss, mlm_accuracy, ...
  mllog.txt                         :::MLLOG lines (mlperf-logging), checked by its compliance checker
  run.json                          input mode, packing factor, batch, seed (for compare_curves)
  tensorboard/                      TensorBoard events
  checkpoints/                      model, optimizer, step and input position; the latest resumes
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import math
import os
import shutil
import signal
import time

import keras
import numpy as np
import tensorflow as tf

from bert_packed import files
from bert_packed.dataset_info import refuse_other_output
from bert_packed.errors import UserError
from bert_packed.files import write_text_atomically
from bert_packed.input_pipeline import PipelineConfig, diagnose_input_error, make_dataset
from bert_packed.model import BertPretrainingModel, export_google_checkpoint, load_google_checkpoint
from bert_packed.training.config import TrainConfig
from bert_packed.training.losses import loss_from_sums, metrics_from_sums, normalizers, pretraining_sums
from bert_packed.training.optimizers import AdamWeightDecay, Lamb, PolynomialWarmup, adjusted_betas

# What one update returns, in this order (pretraining_sums, then the token counts of the rows).
SUM_KEYS = ("mlm_nll", "mlm_predictions", "mlm_correct", "mlm_sequence_nll", "mlm_sequence_correct",
            "mlm_sequences", "nsp_nll", "nsp_correct", "nsp_sequences", "tokens", "slots", "gradient_norm")


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (a NaN or Inf loss, say); the last good checkpoint is kept."""


def make_optimizer(config: TrainConfig):
    """LAMB or AdamW with the reference schedule; betas raised to the packing factor if asked."""
    o = config.optimizer
    beta_1, beta_2 = o.beta_1, o.beta_2
    if o.adjust_betas_for_packing:
        beta_1, beta_2 = adjusted_betas(beta_1, beta_2, config.train_data.packing_factor)
    schedule = PolynomialWarmup(o.learning_rate, o.num_train_steps, o.num_warmup_steps, o.start_warmup_step,
                                o.poly_power, config.train_data.steps_per_update)
    kind = {"lamb": Lamb, "adamw": AdamWeightDecay}[o.name]
    optimizer = kind(schedule, beta_1=beta_1, beta_2=beta_2, epsilon=o.epsilon, weight_decay_rate=o.weight_decay_rate)
    if config.model.precision == "fp16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value (and >= multiple)."""
    return max(multiple, -(-value // multiple) * multiple)


class Trainer:
    """Builds the model, data and optimizer under a tf.distribute strategy, and runs the loop.

    train() runs the named steps in order: claim the output directory, restore (or initialise),
    the loop of updates with its evaluations and checkpoints, and the end of the run.
    evaluate_only() restores and evaluates once (the reference's do_eval without do_train).
    """

    def __init__(self, config: TrainConfig, strategy: tf.distribute.Strategy | None = None):
        self.config = config
        self.strategy = strategy or tf.distribute.get_strategy()
        if config.run.deterministic:
            keras.utils.set_random_seed(config.run.seed)
            tf.config.experimental.enable_op_determinism()
        keras.mixed_precision.set_global_policy(
            {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[config.model.precision])
        # Every micro-step count of the reference becomes whole updates: the schedule is exact, the
        # cadences round up (between updates, and between compiled loops, as on the reference's TPU).
        replicas = self.strategy.num_replicas_in_sync
        if config.train_data.batch_size % replicas:
            raise TrainingError(f"--train_batch_size={config.train_data.batch_size} rows do not divide among the "
                                f"{replicas} replicas: use a multiple of {replicas}")
        n = config.train_data.steps_per_update
        self.steps_per_update = n
        self.last_step = config.optimizer.num_train_steps // n * n
        self.loop_steps = round_up(config.run.iterations_per_loop, n)
        self.save_steps = round_up(config.run.save_checkpoints_steps, self.loop_steps)
        # Every worker takes part in saving (it is collective); only the chief writes output_dir.
        self.is_chief, task_id = _chief(self.strategy)
        self.work_dir = config.run.output_dir if self.is_chief else os.path.join(
            config.run.output_dir, ".workers", f"worker-{task_id}")
        files.makedirs(self.work_dir)
        with self.strategy.scope():
            self.model = BertPretrainingModel(config.model.bert)
            self.model.build()
            self.optimizer = make_optimizer(config)
            self.optimizer.build(self.model.trainable_variables)
            # LAMB or AdamW itself (inside a LossScaleOptimizer with fp16).
            self._loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
            self._base_optimizer = self.optimizer.inner_optimizer if self._loss_scaled else self.optimizer
            # Micro-steps done: also the micro-batches used, which a resumed run skips.
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.sequences = tf.Variable(0, dtype=tf.int64, trainable=False, name="sequences")
        # Dropout's random state is not among the weights Keras checkpoints: add it, so that a
        # resumed deterministic run draws the same masks as an uninterrupted one.
        seeds = {f"seed_{i}": v.value for i, v in enumerate(
            v for v in self.model.variables if v.path.endswith("seed_generator_state"))}
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step,
                                              sequences=self.sequences, dropout_seeds=seeds)
        checkpoint_dir = os.path.join(self.work_dir, "checkpoints")
        _set_aside_a_damaged_state_file(checkpoint_dir)
        self.manager = tf.train.CheckpointManager(self.checkpoint, checkpoint_dir,
                                                  max_to_keep=config.run.keep_checkpoint_max)
        self._train_loop = tf.function(self._train_loop_fn)
        self._eval_step = tf.function(self._eval_step_fn)  # built once: evaluations do not retrace
        self._gradients = tf.function(self._gradients_fn, jit_compile=True) if config.model.xla else self._gradients_fn
        self.train_iterator = None  # made at the first update: after restore(), which sets the step to skip to
        self._stop_requested = False
        self.stopped_by_signal = False  # train() saved and stopped early on SIGTERM

    # ---- data
    def _train_pipeline(self) -> PipelineConfig:
        data = self.config.train_data
        return PipelineConfig(
            data.files, data.shapes, data.input_mode, data.batch_size, True, self.config.run.seed,
            deterministic=self.config.run.deterministic, bucket_boundaries=data.bucket_boundaries,
            skip_batches=int(self.step.numpy()), vocab_size=self.config.model.bert.vocab_size)

    def _eval_pipeline(self) -> PipelineConfig:
        data = self.config.eval_data
        return PipelineConfig(data.files, data.shapes, "packed" if data.packed else "padded", data.batch_size,
                              False, self.config.run.seed, deterministic=self.config.run.deterministic,
                              max_batches=data.max_steps, vocab_size=self.config.model.bert.vocab_size)

    def _train_dataset(self, context):
        return make_dataset(self._train_pipeline(), context)

    def _eval_dataset(self, context):
        return make_dataset(self._eval_pipeline(), context)

    @contextlib.contextmanager
    def _naming_bad_records(self, pipeline: PipelineConfig):
        """TensorFlow's reading errors name no file: find the bad record and raise an error naming it."""
        try:
            yield
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            diagnose_input_error(pipeline)  # raises CorruptRecordError / RecordError when it finds it
            raise TrainingError(f"reading {', '.join(pipeline.files[:3])}...: {_tensorflow_reason(e)}") from None

    # ---- updates
    def _train_loop_fn(self, iterator, num_updates):
        """`num_updates` updates in one call; returns [num_updates, 1 + len(SUM_KEYS)]: each update's
        learning rate and sums, read by the host only once the call is done."""
        results = tf.TensorArray(tf.float32, size=num_updates)
        for index in tf.range(num_updates):
            learning_rate = tf.cast(self._base_optimizer.learning_rate, tf.float32)
            batches = [next(iterator) for _ in range(self.steps_per_update)]
            sums = self.strategy.run(self._replica_update, args=(batches,))
            sums = {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()}
            results = results.write(index, tf.stack([learning_rate] + [sums[k] for k in SUM_KEYS]))
        return results.stack()

    def run_updates(self, num_updates: int) -> np.ndarray:
        """Runs `num_updates` updates in one compiled call (train() calls it between its logs,
        checkpoints and evaluations; benchmarks call it alone).

        Returns:
          [num_updates, 1 + len(SUM_KEYS)]: each update's learning rate and sums.
        """
        if self.train_iterator is None:
            self.train_iterator = iter(self.strategy.distribute_datasets_from_function(self._train_dataset))
        with self._naming_bad_records(self._train_pipeline()):
            return self._train_loop(self.train_iterator, tf.constant(num_updates)).numpy()

    def _replica_update(self, batches):
        context = tf.distribute.get_replica_context()
        variables = self.model.trainable_variables
        scale = tf.cast(self.optimizer.dynamic_scale, tf.float32) if self._loss_scaled else 1.0
        clip_norm = self._base_optimizer.clip_norm
        if self.config.optimizer.clip_after_allreduce:
            counts = {}
            for features in batches:
                for name, value in normalizers(features).items():
                    counts[name] = counts.get(name, 0.0) + value
            counts = {k: context.all_reduce(tf.distribute.ReduceOp.SUM, v) for k, v in counts.items()}
            gradients, totals = self._gradients(batches, counts)
            # Each replica's loss is divided by the global counts, so the replicas' gradients add up
            # to the global gradient: all-reduce and clip it here. Keras would clip per replica.
            gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
            gradients, _ = tf.clip_by_global_norm([g / scale for g in gradients], clip_norm)
            gradients = [g / context.num_replicas_in_sync for g in gradients]
        else:
            gradients, totals = self._gradients(batches, None)
            gradients = [g / (len(batches) * context.num_replicas_in_sync) for g in gradients]
        # Keras sums what each replica hands it (a no-op clip: every norm is within clip_norm).
        self.optimizer.apply_gradients(zip([g * scale for g in gradients], variables))
        totals["gradient_norm"] = tf.linalg.global_norm(gradients)  # checked (finite) by the host
        return totals

    def _gradients_fn(self, batches, counts):
        """Summed gradients and sums of the micro-batches (XLA-compiled with --xla).

        With `counts`, every loss is divided by those (an update's global counts) and the sum is
        returned loss-scaled; without, each micro-batch's loss by its own counts, and each
        gradient is unscaled and clipped before the sum.
        """
        variables = self.model.trainable_variables
        gradients = [tf.zeros_like(v) for v in variables]
        totals = {}
        for features in batches:
            with tf.GradientTape() as tape:
                sums = pretraining_sums(self.model(features, training=True), features)
                loss = loss_from_sums(sums, self.config.model.loss_averaging, counts)
                if self._loss_scaled:
                    loss = self.optimizer.scale_loss(loss)
            micro = [tf.convert_to_tensor(d) for d in tape.gradient(loss, variables)]
            if counts is None:
                scale = tf.cast(self.optimizer.dynamic_scale, tf.float32) if self._loss_scaled else 1.0
                micro, _ = tf.clip_by_global_norm([d / scale for d in micro], self._base_optimizer.clip_norm)
            gradients = [g + d for g, d in zip(gradients, micro)]
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
        with self._naming_bad_records(self._eval_pipeline()):
            for features in self.strategy.distribute_datasets_from_function(self._eval_dataset):
                sums = self._eval_step(features)
                totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
        return metrics_from_sums(totals, self.config.model.loss_averaging) if totals else {}

    def _eval_step_fn(self, features):
        def replica(features):
            return pretraining_sums(self.model(features, training=False), features)
        sums = self.strategy.run(replica, args=(features,))
        return {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in sums.items()}

    def evaluate_only(self) -> dict:
        """Evaluates the latest checkpoint of output_dir, or else init_checkpoint; writes the result to
        eval_results.txt and returns it. A training run in output_dir is left alone (the reference
        evaluates beside a running training job)."""
        source = self.restore()
        if source is None and not self.config.model.init_checkpoint:
            raise TrainingError(f"nothing to evaluate: no checkpoint in {self.manager.directory} and no "
                                f"--init_checkpoint")
        metrics = self.evaluate()
        record = {"step": int(self.step.numpy()), "sequences": int(self.sequences.numpy()),
                  "checkpoint": source or self.config.model.init_checkpoint, **metrics}
        if self.is_chief:  # eval_results.txt only: a training run may be writing its logs here meanwhile
            write_text_atomically(os.path.join(self.work_dir, "eval_results.txt"),
                                  "".join(f"{key} = {value}\n" for key, value in sorted(record.items())))
        logging.info("eval of %s: mlm accuracy %.4f, loss %.4f over %d sequences", record["checkpoint"],
                     metrics.get("mlm_accuracy", 0.0), metrics.get("loss", 0.0), metrics.get("num_sequences", 0))
        return record

    # ---- the run
    def train(self) -> dict:
        """Runs (or resumes) training to num_train_steps or the target accuracy; returns the last metrics."""
        with files.exclusive(os.path.join(self.work_dir, ".lock"), "run_pretraining"):
            return self._train()

    def _train(self) -> dict:
        refuse_other_output(self.work_dir, "a training run")
        self.claim_output_dir()
        resumed = self.restore()
        logs = self._open_logs(resumed)
        if resumed and (int(self.step.numpy()) >= self.last_step or self._on_any_worker(logs.reached)):
            try:
                return self._complete(logs)
            finally:
                logs.close()
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            if not resumed:
                logs.mllog("init_stop")
                logs.mllog("run_start")
            logs.block_start(int(self.sequences.numpy()))
            metrics, stopped = self._loop(logs)
            if not stopped:
                self._finish(logs)
        finally:
            signal.signal(signal.SIGTERM, previous)
            logs.close()
        return metrics

    def claim_output_dir(self) -> None:
        """Refuses an output_dir that holds another run; records this run (run.json, flags.txt)."""
        c = self.config
        summary = {"input_mode": c.train_data.input_mode, "packing_factor": c.train_data.packing_factor,
                   "train_batch_size": c.train_data.batch_size, "steps_per_update": c.train_data.steps_per_update,
                   "sequences_per_update": c.train_data.sequences_per_update,
                   "loss_averaging": c.model.loss_averaging, "seed": c.run.seed,
                   "target_mlm_accuracy": c.eval_data.target_mlm_accuracy, "bert_config": c.model.bert.to_dict()}
        run_file = os.path.join(self.work_dir, "run.json")
        if files.exists(run_file):
            with files.open_file(run_file) as f:
                previous = json.load(f)
            changed = sorted(k for k in summary if k in previous and previous[k] != summary[k])
            if changed:
                raise TrainingError(f"{c.run.output_dir}: holds another run ({', '.join(changed)} differ); use a new "
                                    f"--output_dir, or the same flags to resume it")
        write_text_atomically(run_file, json.dumps(summary, indent=1) + "\n")
        if c.run.flags_text:
            write_text_atomically(os.path.join(self.work_dir, "flags.txt"), c.run.flags_text)

    def restore(self) -> str | None:
        """Restores the newest checkpoint of output_dir that restores (returned), or loads init_checkpoint.

        The state file's checkpoint comes first, then the others, newest first; one that does not
        restore is skipped with one line, and no checkpoint is ever deleted here.
        """
        candidates = _checkpoints_newest_first(self.manager.directory, self.manager.latest_checkpoint)
        problems = []
        for path in candidates:
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except Exception as e:  # noqa: BLE001 - whatever broke, the checkpoint is what to name
                problems.append(f"{path}: cannot restore this checkpoint ({str(e).splitlines()[0]})")
                logging.warning("%s; trying an older one", problems[-1])
                continue
            if problems:
                logging.warning("resumed from %s, the newest checkpoint that restores", path)
            logging.info("resumed from %s at step %d", path, int(self.step.numpy()))
            return path
        if problems:
            raise TrainingError(f"{'; '.join(problems)}; no checkpoint of {self.manager.directory} restores: "
                                f"remove them to start over") from None
        if self.config.model.init_checkpoint:
            load_google_checkpoint(self.model, self.config.model.init_checkpoint)
            logging.info("initialised from %s", self.config.model.init_checkpoint)
        return None

    def _open_logs(self, resumed: str | None) -> _Logs:
        """The logs, continued after the checkpoint resumed from: steps logged past it are redone, so
        their lines go, and the clocks continue from the checkpoint's. A fresh run logs the MLPerf
        submission and hyper-parameters."""
        step = int(self.step.numpy())
        last, last_eval = _keep_logged_steps(self.work_dir, step)
        logs = _Logs(self.work_dir)
        logs.last_record = last
        logs.last_eval_step = last_eval.get("step")
        logs.reached = (last_eval.get("step") == step
                        and last_eval.get("mlm_accuracy", 0.0) >= self.config.eval_data.target_mlm_accuracy)
        logs.seconds_before = logs.last_seconds = last.get("seconds", 0.0)
        logs.train_seconds_before = last.get("train_seconds", 0.0)
        c, betas = self.config, self._base_optimizer
        if not resumed:
            _log_run_parameters(logs, c, betas)
        logging.info("optimizer %s, betas %.6f / %.6f (packing factor %.3f, adjusted: %s); %d micro-steps of %d "
                     "rows, %d an update (%.1f sequences on average), %d a compiled loop; checkpoints every %d",
                     c.optimizer.name, betas.beta_1, betas.beta_2, c.train_data.packing_factor,
                     c.optimizer.adjust_betas_for_packing, self.last_step, c.train_data.batch_size,
                     self.steps_per_update, c.train_data.sequences_per_update, self.loop_steps, self.save_steps)
        return logs

    def _loop(self, logs: _Logs) -> tuple[dict, bool]:
        """Compiled loops of updates until num_train_steps, the target accuracy or SIGTERM, with logs,
        checkpoints and evaluations between them; returns (the last metrics, whether SIGTERM stopped it)."""
        c, n = self.config, self.steps_per_update
        every = c.eval_data.every_samples
        step, sequences = int(self.step.numpy()), int(self.sequences.numpy())
        next_eval = (sequences // every + 1) * every if every else None
        metrics, start = {}, time.perf_counter()
        first_call, first_step = True, step
        while step < self.last_step:
            num_updates = min(self.loop_steps, self.last_step - step) // n
            if first_call:
                logging.info("compiling the training step and running the first %d micro-steps", num_updates * n)
            results = self.run_updates(num_updates)
            seconds = logs.seconds_before + time.perf_counter() - start
            if first_call:
                logging.info("compiled and ran the first loop in %.1f s", seconds - logs.seconds_before)
                first_call = False
            for row in results:
                learning_rate, sums = float(row[0]), dict(zip(SUM_KEYS, row[1:].tolist()))
                metrics = metrics_from_sums({k: v for k, v in sums.items() if k not in ("tokens", "slots")},
                                            c.model.loss_averaging)
                if not math.isfinite(metrics["loss"]) or not math.isfinite(sums["gradient_norm"]):
                    what = (f"loss is {metrics['loss']}" if not math.isfinite(metrics["loss"])
                            else f"the gradient norm is {sums['gradient_norm']}")
                    raise TrainingError(f"{what} at step {step + n}; stopped without saving, the last good "
                                        f"checkpoint is {self._last_finite_checkpoint()}")
                step += n
                sequences += int(metrics["num_sequences"])
                record = {"step": step, "sequences": sequences, "learning_rate": learning_rate, "seconds": seconds,
                          "train_seconds": logs.train_seconds_before + seconds - logs.seconds_before
                          - logs.eval_seconds,
                          "real_tokens": sums["tokens"], "padding_efficiency": sums["tokens"] / sums["slots"],
                          **metrics}
                logs.train(record)
                if step % c.run.log_every_steps < n or step == self.last_step:
                    interval = max(seconds - logs.last_seconds, 1e-9)
                    left = (self.last_step - step) * (seconds - logs.seconds_before - logs.eval_seconds) / max(
                        step - first_step, 1)
                    logging.info("step %d/%d: loss %.4f, mlm accuracy %.4f, %d sequences (%.1f/s, %.0f real "
                                 "tokens/s, padding efficiency %.1f%%), about %.0f s left", step, self.last_step,
                                 metrics["loss"], metrics["mlm_accuracy"], sequences,
                                 metrics["num_sequences"] * len(results) / interval,
                                 sums["tokens"] * len(results) / interval, 100 * record["padding_efficiency"], left)
            logs.last_seconds = seconds
            self.step.assign(step)
            self.sequences.assign(sequences)
            if step % self.save_steps == 0:
                self._save()
            if next_eval is not None and sequences >= next_eval and c.eval_data.files:
                next_eval = (sequences // every + 1) * every
                if self._evaluate_and_log(logs, step, seconds):
                    break
                if step < self.last_step:
                    logs.block_start(sequences)
            if self._stop_requested:
                self._save()
                self.stopped_by_signal = True
                logging.warning("SIGTERM: saved step %d; run again with the same output_dir to resume", step)
                return metrics, True
        return metrics, False

    def _complete(self, logs: _Logs) -> dict:
        """A run restarted at its end (its last step, or the target reached): finishes what a kill
        cut short of _finish, if anything; returns the last training record."""
        if self._on_any_worker(not logs.run_stopped):
            self._finish(logs)
        logging.info("%s: trained to step %d", self.config.run.output_dir, int(self.step.numpy()))
        return logs.last_record

    def _on_any_worker(self, flag: bool) -> bool:
        """Whether `flag` holds on any worker. Each worker reads its own logs, and a kill can come
        between two workers' writes: deciding together keeps every worker in the same collectives."""
        if _worker_resolver(self.strategy) is None:  # one worker: nobody to agree with
            return flag
        value = tf.constant(1.0 if flag else 0.0)

        @tf.function
        def any_worker(v):
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, self.strategy.run(lambda: tf.identity(v)),
                                        axis=None)

        return bool(any_worker(value).numpy() > 0.0)

    def _finish(self, logs: _Logs) -> None:
        """The end of the run: the last checkpoint, an evaluation at the last step (so that every
        run's final figure is at its last step), the weights as a TF1 checkpoint, and run_stop."""
        self._save()
        step, sequences = int(self.step.numpy()), int(self.sequences.numpy())
        if self.config.eval_data.files and self._on_any_worker(logs.last_eval_step != step):
            self._evaluate_and_log(logs, step, logs.last_seconds)
        if self.is_chief:
            path = export_google_checkpoint(self.model, os.path.join(self.work_dir, f"model.ckpt-{step}"))
            logging.info("weights exported as %s (google-research/MLPerf TF1 names: an --init_checkpoint)", path)
        logs.block_stop(sequences)
        logs.mllog("run_stop", metadata={"status": "success" if logs.reached else "aborted", "epoch_num": sequences})

    def _evaluate_and_log(self, logs, step, seconds) -> bool:
        sequences = int(self.sequences.numpy())
        logs.block_stop(sequences)
        logs.mllog("eval_start", metadata={"epoch_num": sequences})
        logging.info("evaluating at step %d (%d sequences trained)", step, sequences)
        start = time.perf_counter()
        metrics = self.evaluate()
        logs.eval_seconds += time.perf_counter() - start
        record = {"step": step, "sequences": sequences, "seconds": seconds, **metrics}
        logs.eval(record)
        logs.last_eval_step = step
        if not logs.eval_samples_logged:
            logs.mllog("eval_samples", int(metrics.get("num_sequences", 0)))
            logs.eval_samples_logged = True
        logs.mllog("eval_accuracy", metrics.get("mlm_accuracy", 0.0), {"epoch_num": sequences})
        logs.mllog("eval_stop", metadata={"epoch_num": sequences})
        logging.info("eval at step %d (%d sequences): mlm accuracy %.4f, loss %.4f over %d eval sequences, in %.1f s",
                     step, sequences, metrics.get("mlm_accuracy", 0.0), metrics.get("loss", 0.0),
                     metrics.get("num_sequences", 0), time.perf_counter() - start)
        target = self.config.eval_data.target_mlm_accuracy
        if metrics.get("mlm_accuracy", 0.0) >= target:
            logs.reached = True
            logging.info("target mlm accuracy %.3f reached at step %d after %d sequences", target, step, sequences)
            return True
        return False

    def _save(self) -> None:
        """Saves the current step unless it is the latest checkpoint already; never non-finite weights."""
        step = int(self.step.numpy())
        # One reduction and one read back, not one per variable.
        if not bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in self.model.trainable_variables])):
            raise TrainingError(f"the weights at step {step} are not finite; not saved, the last good checkpoint "
                                f"is {self._last_finite_checkpoint()}")
        latest = self.manager.latest_checkpoint
        if latest is None or not latest.endswith(f"-{step}"):
            try:
                self.manager.save(checkpoint_number=step)
            except Exception:
                # A failed save (a full disk) leaves TensorFlow's temporary files behind.
                for path in glob.glob(os.path.join(self.manager.directory, f"ckpt-{step}_temp*")):
                    shutil.rmtree(path, ignore_errors=True)
                raise

    def _last_finite_checkpoint(self) -> str:
        """The newest checkpoint whose every float tensor is finite (read back to check), named."""
        for path in _checkpoints_newest_first(self.manager.directory, self.manager.latest_checkpoint):
            try:
                reader = tf.train.load_checkpoint(path)
                if all(np.isfinite(reader.get_tensor(name)).all() for name, dtype in
                       reader.get_variable_to_dtype_map().items() if dtype.is_floating):
                    return path
            except Exception:  # noqa: BLE001 - unreadable: not a good checkpoint either
                continue
        return "none: no checkpoint was saved yet"

    def _on_sigterm(self, signum, frame):
        self._stop_requested = True


def _log_run_parameters(logs: _Logs, config: TrainConfig, betas) -> None:
    """The MLPerf submission fields and hyper-parameters (closed BERT rules), once per run."""
    c, submission = config, config.run.submission
    logs.mllog("cache_clear", True)
    logs.mllog("init_start")
    logs.mllog("submission_benchmark", "bert")
    logs.mllog("submission_division", submission.division)
    logs.mllog("submission_org", submission.org)
    logs.mllog("submission_platform", submission.platform)
    logs.mllog("submission_status", submission.status)
    # MLPerf counts samples: sequences, not packs.
    logs.mllog("global_batch_size", round(c.train_data.sequences_per_update))
    logs.mllog("packing_factor", c.train_data.packing_factor)
    logs.mllog("gradient_accumulation_steps", c.train_data.steps_per_update)
    logs.mllog("train_samples", c.train_data.num_sequences)
    o = c.optimizer
    logs.mllog("opt_base_learning_rate", o.learning_rate)
    logs.mllog("opt_lamb_epsilon", o.epsilon)
    logs.mllog("opt_learning_rate_training_steps", o.num_train_steps)
    logs.mllog("opt_learning_rate_warmup_steps", o.num_warmup_steps)
    logs.mllog("num_warmup_steps", o.num_warmup_steps)
    logs.mllog("start_warmup_step", o.start_warmup_step)
    logs.mllog("opt_lamb_beta_1", betas.beta_1)
    logs.mllog("opt_lamb_beta_2", betas.beta_2)
    logs.mllog("opt_lamb_weight_decay_rate", o.weight_decay_rate)
    logs.mllog("seed", c.run.seed)


def _tensorflow_reason(error: Exception) -> str:
    """The line of a TensorFlow error that says what went wrong (an assertion's own message first)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "assertion failed: [" in line:
            return line.split("assertion failed: [", 1)[1].split("]", 1)[0]
    informative = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node"))]
    return (informative or lines or [type(error).__name__])[0]


def _checkpoints_newest_first(directory: str, latest: str | None) -> list[str]:
    """The checkpoints of `directory`: the state file's latest first, then the others, newest first."""
    found = [path[:-len(".index")] for path in files.glob(os.path.join(directory, "ckpt-*.index"))]
    numbered = sorted((int(path.rsplit("-", 1)[1]), path) for path in found if path.rsplit("-", 1)[1].isdigit())
    others = [path for _, path in reversed(numbered) if path != latest]
    return ([latest] if latest else []) + others


def _set_aside_a_damaged_state_file(directory: str) -> None:
    """Renames a `checkpoint` state file that cannot be read or names no checkpoint of the
    directory, so that restore() falls back to the checkpoints themselves; said in one line."""
    path = os.path.join(directory, "checkpoint")
    if not files.exists(path):
        return
    try:
        state = tf.train.get_checkpoint_state(directory)
        named = state.model_checkpoint_path if state else ""
        usable = bool(named) and files.exists((named if os.path.isabs(named) or "://" in named
                                               else os.path.join(directory, named)) + ".index")
    except Exception:  # noqa: BLE001 - any parse failure of the state file means the same
        usable = False
    if not usable:
        aside = f"{path}.damaged-{int(time.time())}"
        files.move(path, aside)
        logging.warning("%s: unreadable or names a missing checkpoint; set aside as %s, resuming from the newest "
                        "checkpoint that restores", path, aside)


def _keep_logged_steps(directory: str, step: int) -> tuple[dict, dict]:
    """Drops the train and eval log lines after `step`; returns the last train and eval records kept.

    A torn last line (a write cut short by a crash or a power loss) is dropped with a warning; a
    damaged line anywhere else stops the run, named.
    """
    last = {"train_log.jsonl": {}, "eval_log.jsonl": {}}
    for name in last:
        path = os.path.join(directory, name)
        if not files.exists(path):
            continue
        with files.open_file(path) as f:
            lines = [line for line in f.read().split("\n") if line.strip()]
        records = []
        for number, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines):
                    raise TrainingError(f"{path}: line {number} is not JSON; the log is damaged, not just torn "
                                        f"at its end") from None
                logging.warning("%s: dropped its torn last line %d (%d characters)", path, number, len(line))
        kept = [record for record in records if record["step"] <= step]
        write_text_atomically(path, "".join(json.dumps(record) + "\n" for record in kept))
        if kept:
            last[name] = kept[-1]
    return last["train_log.jsonl"], last["eval_log.jsonl"]


def _worker_resolver(strategy):
    """The strategy's cluster resolver when this process is one worker of several, else None."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver if resolver is not None and resolver.task_type else None


def _chief(strategy) -> tuple[bool, int]:
    """(whether this process is the chief, its task index) under multi-worker training."""
    resolver = _worker_resolver(strategy)
    if resolver is None:
        return True, 0
    cluster = resolver.cluster_spec().as_dict()
    if "chief" in cluster:
        return resolver.task_type == "chief", resolver.task_id or 0
    return resolver.task_type == "worker" and resolver.task_id == 0, resolver.task_id or 0


class _Logs:
    """train_log.jsonl, eval_log.jsonl, TensorBoard and :::MLLOG lines, appended on resume."""

    def __init__(self, output_dir: str):
        from mlperf_logging import mllog

        self.train_file = files.open_file(os.path.join(output_dir, "train_log.jsonl"), "a")
        self.eval_file = files.open_file(os.path.join(output_dir, "eval_log.jsonl"), "a")
        self.writer = tf.summary.create_file_writer(os.path.join(output_dir, "tensorboard"))
        # :::MLLOG lines go to mllog.txt only (any filesystem), never to the console.
        mllog_path = os.path.join(output_dir, "mllog.txt")
        self.run_stopped = False  # run_stop is logged: the run ran to its end
        if files.exists(mllog_path):
            with files.open_file(mllog_path) as f:
                self.run_stopped = '"key": "run_stop"' in f.read()
        self.mllog_file = files.open_file(mllog_path, "a")
        logger = logging.getLogger("bert_packed.mllog")
        logger.handlers = [_FileHandler(self.mllog_file)]
        logger.setLevel(logging.INFO)
        logger.propagate = False
        self.mllogger = mllog.get_mllogger()
        if self.mllogger.logger is not logger:  # mllog refuses the logger it already has
            mllog.config(logger=logger, root_dir=os.getcwd())
        self.block_open = False  # between block_start and block_stop
        self.eval_samples_logged = False
        self.seconds_before = 0.0  # the clocks of the checkpoint resumed from
        self.train_seconds_before = 0.0
        self.last_seconds = 0.0
        self.eval_seconds = 0.0  # of this process: train_seconds = seconds - eval_seconds
        self.reached = False
        self.last_record = {}  # the last train_log.jsonl record kept at the start
        self.last_eval_step = None  # the step of the last evaluation logged

    def train(self, record: dict) -> None:
        self.train_file.write(json.dumps(record) + "\n")
        self.train_file.flush()
        with self.writer.as_default():
            for name in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate"):
                tf.summary.scalar(f"train/{name}", record[name], step=record["step"])
                # Packed and padded runs line up against sequences seen, not steps.
                tf.summary.scalar(f"train_by_sequences/{name}", record[name], step=record["sequences"])

    def eval(self, record: dict) -> None:
        self.eval_file.write(json.dumps(record) + "\n")
        self.eval_file.flush()
        with self.writer.as_default():
            for name in ("loss", "mlm_accuracy", "nsp_accuracy"):
                tf.summary.scalar(f"eval/{name}", record.get(name, 0.0), step=record["step"])
                tf.summary.scalar(f"eval_by_sequences/{name}", record.get(name, 0.0), step=record["sequences"])

    def mllog(self, key, value=None, metadata=None, stack_offset=2) -> None:
        """One :::MLLOG line; its file and line are the caller's."""
        self.mllogger.event(key=key, value=value, metadata=metadata, stack_offset=stack_offset)

    def block_start(self, sequences: int) -> None:
        """Opens a block of training between evaluations (MLPerf counts samples: sequences)."""
        if not self.block_open:
            self.mllog("block_start", metadata={"samples_count": sequences, "first_epoch_num": sequences},
                       stack_offset=3)
            self.block_open = True

    def block_stop(self, sequences: int) -> None:
        if self.block_open:
            self.mllog("block_stop", metadata={"samples_count": sequences, "first_epoch_num": sequences},
                       stack_offset=3)
            self.block_open = False

    def close(self) -> None:
        self.train_file.close()
        self.eval_file.close()
        self.mllog_file.close()
        self.writer.close()


class _FileHandler(logging.Handler):
    """A logging handler that appends each message as a line to an open file (a gfile too)."""

    def __init__(self, file):
        super().__init__()
        self.file = file

    def emit(self, record: logging.LogRecord) -> None:
        self.file.write(record.getMessage() + "\n")
        self.file.flush()
