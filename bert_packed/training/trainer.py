"""The training loop: the MLPerf recipe on packed (or padded, or bucketed) data.

Trainer.train() runs, in order:
  1. claim the run directory: refuse one that holds another run, record this one (run.json,
     flags.txt);
  2. resume: restore the newest checkpoint that restores (else start from --init_checkpoint or
     random weights) and cut the logs back to what that checkpoint had seen; a run that has
     finished is left as it is;
  3. compiled loops of updates until num_train_steps, the target accuracy or a stop signal
     (SIGTERM, SIGINT), with logs, evaluations and checkpoints between the loops;
  4. the end: a checkpoint, an evaluation at the last step, the weights exported with
     google-research names, run_stop, and `finished` in run.json.
A checkpoint is saved after everything its loop logged. So a run stopped at any moment and
started again with the same command trains, evaluates and logs exactly what the uninterrupted
run does, once (docs/reliability.md).

The rooms it uses: config (the settings), update (the compiled update), evaluation,
checkpoints, logs and mlperf_log (what is logged), bert_packed.run_directory (the files).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time

import numpy as np
import tensorflow as tf

from bert_packed import files
from bert_packed.dataset_info import refuse_other_output
from bert_packed.errors import TrainingError
from bert_packed.input_pipeline import PipelineConfig, make_dataset, reading_errors_named
from bert_packed.model import BertPretrainingModel, export_google_checkpoint, load_google_checkpoint
from bert_packed.model.checkpoint import checkpoint_step
from bert_packed.run_directory import LOGS, RunDirectory
from bert_packed.training.checkpoints import Checkpoints
from bert_packed.training.config import TrainConfig
from bert_packed.training.distribution import chief, common_step, on_any_worker
from bert_packed.training.evaluation import Evaluation
from bert_packed.training.logs import RunLogs
from bert_packed.training.losses import metrics_from_sums
from bert_packed.training.process import check_process_set_up
from bert_packed.training.update import SUM_KEYS, Update, make_optimizer

__all__ = ["Trainer", "TrainingError"]



class Trainer:
    """Builds the model, its optimizer and checkpoints under a tf.distribute strategy; trains.

    Attributes:
      config: the run's settings (for the strategy's replicas).
      model: the BertPretrainingModel.
      optimizer: its optimizer (a LossScaleOptimizer with fp16).
      update: the compiled update (update.loop).
      evaluate: evaluate() -> the eval set's metrics.
      state: what a checkpoint holds (a tf.train.Checkpoint).
      checkpoints: the run's checkpoints.
      directory: where this process writes (the chief: output_dir).
      step, sequences: micro-steps done and sequences seen (checkpointed).
      stopped_by: "SIGTERM" or "SIGINT" when a signal stopped train() after a save, else None.
    """

    def __init__(self, config: TrainConfig, strategy: tf.distribute.Strategy | None = None):
        strategy = strategy or tf.distribute.get_strategy()
        config = config.on_replicas(strategy.num_replicas_in_sync)
        check_process_set_up(config)
        self.config, self.strategy = config, strategy
        self.is_chief, task = chief(strategy)
        root = RunDirectory(config.run.output_dir)
        self.directory = root if self.is_chief else root.worker(task)
        with strategy.scope():
            self.model = BertPretrainingModel(config.model.bert)
            self.model.build()
            self.optimizer = make_optimizer(config)
            self.optimizer.build(self.model.trainable_variables)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.sequences = tf.Variable(0, dtype=tf.int64, trainable=False, name="sequences")
            # The logs' sizes when the checkpoint was saved: a resumed run cuts them back to these.
            self.log_sizes = tf.Variable([0] * len(LOGS), dtype=tf.int64, trainable=False, name="log_sizes")
        self.update = Update(config, self.model, self.optimizer, strategy)
        self.evaluate = Evaluation(config, self.model, strategy)
        # Dropout's random state is not among the weights Keras checkpoints: add it, so that a
        # resumed deterministic run draws the same masks as an uninterrupted one.
        seeds = {f"seed_{i}": v.value for i, v in enumerate(
            v for v in self.model.variables if v.path.endswith("seed_generator_state"))}
        self.state = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step,
                                         sequences=self.sequences, log_sizes=self.log_sizes, dropout_seeds=seeds)
        self.checkpoints = Checkpoints(self.directory.checkpoints, self.state, config.run.keep_checkpoint_max)
        self.train_iterator = None  # made at the first update, after the restore that sets the step
        self.stopped_by = None

    # ---- data and updates
    def _train_pipeline(self) -> PipelineConfig:
        data, bert = self.config.train_data, self.config.model.bert
        return PipelineConfig(data.files, data.shapes, data.input_mode, data.rows_per_micro_batch, True,
                              self.config.run.seed, deterministic=self.config.run.deterministic,
                              bucket_boundaries=data.bucket_boundaries, skip_steps=int(self.step.numpy()),
                              vocab_size=bert.vocab_size, type_vocab_size=bert.type_vocab_size, plan=data.plan,
                              window=data.online_packing_window)

    def _train_dataset(self, context):
        return make_dataset(self._train_pipeline(), context)

    def run_updates(self, num_updates: int) -> np.ndarray:
        """Runs `num_updates` updates in one compiled call (train() calls it between its logs,
        checkpoints and evaluations; benchmarks call it alone).

        Returns:
          [num_updates, 1 + len(SUM_KEYS)]: each update's learning rate and sums.
        """
        if self.train_iterator is None:
            self.train_iterator = iter(self.strategy.distribute_datasets_from_function(self._train_dataset))
        with reading_errors_named(self._train_pipeline()):
            return self.update.loop(self.train_iterator, tf.constant(num_updates)).numpy()

    # ---- the run
    def train(self) -> dict:
        """Runs (or resumes) training to num_train_steps or the target accuracy; returns the last
        train record."""
        files.makedirs(self.directory.path)
        with files.exclusive(os.path.join(self.directory.path, ".lock"), "run_pretraining"):
            if self._resume(self._claim()):
                logging.info("%s: finished at step %d; nothing to do", self.config.run.output_dir,
                             int(self.step.numpy()))
                return RunLogs.last_train_record(self.directory)
            logs = RunLogs(self.directory)
            try:
                return self._run(logs)
            finally:
                logs.close()

    def _claim(self) -> dict:
        """Refuses a directory that holds another run, or this run on other data; records this
        one. Returns run.json as found."""
        c = self.config
        refuse_other_output(self.directory.path, "a training run")
        identity = {"input_mode": c.train_data.input_mode, "packing_factor": c.train_data.packing_factor,
                    "train_batch_size": c.train_data.rows_per_micro_batch,
                    "steps_per_update": c.train_data.steps_per_update,
                    "sequences_per_update": c.train_data.sequences_per_update,
                    "loss_averaging": c.model.loss_averaging, "seed": c.run.seed,
                    "target_mlm_accuracy": c.eval_data.target_mlm_accuracy, "bert_config": c.model.bert.to_dict(),
                    # Packing on the fly: another window makes other packs, and the batches a resumed run skips
                    # would not be the ones it trained on.
                    "online_packing_window": (c.train_data.online_packing_window
                                              if c.train_data.input_mode == "packed_online" else None)}
        o = c.optimizer  # by its flags' names; --num_train_steps may change (a run goes on past its end)
        identity.update({"optimizer": o.name, "learning_rate": o.learning_rate, "num_warmup_steps": o.num_warmup_steps,
                         "start_warmup_step": o.start_warmup_step, "poly_power": o.poly_power,
                         "lamb_beta_1": o.beta_1, "lamb_beta_2": o.beta_2, "lamb_weight_decay_rate": o.weight_decay_rate,
                         "epsilon": o.epsilon, "adjust_betas_for_packing": o.adjust_betas_for_packing,
                         "clip_by_global_norm_after_gradient_allreduce": o.clip_after_allreduce})
        data = {"train_files": c.train_data.identity, "eval_files": c.eval_data.identity}
        previous = self.directory.claim(identity, data)
        if c.run.flags_text:
            self.directory.write_flags(c.run.flags_text)
        if c.train_data.histogram:  # counted (no metadata.json counts the files): not again
            self.directory.write_histogram("train", c.train_data.identity, c.train_data.histogram)
        return previous

    def _resume(self, previous: dict) -> bool:
        """Restores the newest checkpoint that restores (else --init_checkpoint) and cuts the logs
        back to it; returns whether the run had finished (then nothing changes)."""
        self.checkpoints.clean_up()
        files.remove_leftovers(self.directory.path)
        resumed = self.checkpoints.restore(lambda newest, can_restore: common_step(self.strategy, newest,
                                                                                   can_restore))
        step = int(self.step.numpy())
        if resumed:
            logging.info("resumed from %s at step %d", resumed, step)
        elif self.config.model.init_checkpoint:
            load_google_checkpoint(self.model, self.config.model.init_checkpoint)
            logging.info("initialised from %s", self.config.model.init_checkpoint)
        finished = previous.get("finished") or {}
        done = bool(resumed) and finished.get("step") == step and (step >= self.config.last_step
                                                                  or finished.get("reached", False))
        if not on_any_worker(self.strategy, not done):
            return True
        self.directory.cut_logs(self.log_sizes.numpy().tolist())
        if finished:  # it goes on: no longer finished (run.json as claimed, with today's data paths)
            self.directory.write_info({k: v for k, v in self.directory.read_info().items() if k != "finished"})
        return False

    def _run(self, logs: RunLogs) -> dict:
        c, step = self.config, int(self.step.numpy())
        if not logs.mlperf.started:
            logs.mlperf.run_parameters(c, c.betas)
        for note in c.rounding_notes():
            logging.warning("%s", note)
        for line in c.describe():
            logging.info("%s", line)
        if not c.eval_data.files:
            logging.warning("this run does not evaluate (no eval files): its mllog.txt cannot pass the MLPerf "
                            "compliance checker, which requires an evaluation (eval_accuracy)")
        last = logs.last_eval
        reached = last.get("step") == step and last.get("mlm_accuracy", 0.0) >= c.eval_data.target_mlm_accuracy
        stopped = False
        if step < c.last_step and not on_any_worker(self.strategy, reached):
            with self._stop_signals():
                logs.mlperf.block_start(int(self.sequences.numpy()))
                reached, stopped = self._loop(logs)
        if not stopped:
            self._finish(logs, reached)
            if self.stopped_by:  # it came during the evaluation that reached the target: nothing to resume
                logging.info("%s came as the run finished; it is complete", self.stopped_by)
                self.stopped_by = None
        return logs.last_record

    def _loop(self, logs: RunLogs) -> tuple[bool, bool]:
        """Compiled loops of updates until num_train_steps, the target accuracy or a stop signal,
        with logs, evaluations and checkpoints between them; returns (target reached, stopped)."""
        c, n = self.config, self.config.train_data.steps_per_update
        every = c.eval_every_samples
        step, sequences = int(self.step.numpy()), int(self.sequences.numpy())
        next_eval = (sequences // every + 1) * every if every else None
        start, first_step = time.perf_counter(), step
        while step < c.last_step:
            if step == first_step:
                logging.debug("compiling the training step and running the first %d micro-steps",
                             min(c.loop_steps, c.last_step - step))
            results = self.run_updates(min(c.loop_steps, c.last_step - step) // n)
            seconds = logs.seconds_before + time.perf_counter() - start
            if step == first_step:
                logging.debug("compiled and ran the first loop in %.1f s", seconds - logs.seconds_before)
            for row in results:
                step += n
                record = self._train_record(row, step, sequences, seconds, logs)
                sequences = record["sequences"]
                logs.train(record)
            logs.say_progress(c, first_step, len(results), seconds)
            self.step.assign(step)
            self.sequences.assign(sequences)
            if next_eval is not None and sequences >= next_eval and c.eval_data.files:
                next_eval = (sequences // every + 1) * every
                if self._evaluate_and_log(logs, step, seconds):
                    return True, False
                if step < c.last_step:
                    logs.mlperf.block_start(sequences)
            if step % c.save_steps == 0 or self.stopped_by:
                self._save()
            if self.stopped_by:
                logging.debug("%s: saved step %d", self.stopped_by, step)  # the command says so, with its status
                return False, True
        return False, False

    def _train_record(self, row: np.ndarray, step: int, sequences_before: int, seconds: float, logs: RunLogs) -> dict:
        """One update's train record, after checking its loss and gradient are finite."""
        sums = dict(zip(SUM_KEYS, row[1:].tolist()))
        metrics = metrics_from_sums({k: v for k, v in sums.items() if k not in ("tokens", "slots")},
                                    self.config.model.loss_averaging)
        for what, value in (("loss", metrics["loss"]), ("the gradient norm", sums["gradient_norm"])):
            if not math.isfinite(value):
                raise TrainingError(f"{what} is {value} at step {step}; stopped without saving, the last good "
                                    f"checkpoint is {self.checkpoints.last_finite()}")
        return {"step": step, "sequences": sequences_before + int(metrics["num_sequences"]),
                "learning_rate": float(row[0]), "seconds": seconds,
                "train_seconds": logs.train_seconds_before + seconds - logs.seconds_before - logs.eval_seconds,
                "real_tokens": sums["tokens"], "predictions": sums["mlm_predictions"],
                "padding_efficiency": sums["tokens"] / sums["slots"], **metrics}

    def _evaluate_and_log(self, logs: RunLogs, step: int, seconds: float) -> bool:
        """Evaluates and logs; returns whether the target accuracy is reached."""
        sequences = int(self.sequences.numpy())
        logging.debug("evaluating at step %d (%d sequences trained)", step, sequences)
        start = time.perf_counter()
        metrics = self.evaluate()
        logs.eval_seconds += time.perf_counter() - start
        logs.eval({"step": step, "sequences": sequences, "seconds": seconds, **metrics})
        accuracy = metrics.get("mlm_accuracy", 0.0)
        logs.mlperf.evaluation(sequences, accuracy, int(metrics.get("num_sequences", 0)))
        logging.info("eval at step %d (%d sequences): mlm accuracy %.4f, loss %.4f over %d eval sequences, in %.1f s",
                     step, sequences, accuracy, metrics.get("loss", 0.0), metrics.get("num_sequences", 0),
                     time.perf_counter() - start)
        target = self.config.eval_data.target_mlm_accuracy
        if accuracy >= target:
            logging.info("target mlm accuracy %.3f reached at step %d after %d sequences", target, step, sequences)
        return accuracy >= target

    def _finish(self, logs: RunLogs, reached: bool) -> None:
        """The end of the run: the last checkpoint, an evaluation at the last step (so that every
        run's final figure is at its last step), the weights as a TF1 checkpoint, and run_stop."""
        self._save()
        step, sequences = int(self.step.numpy()), int(self.sequences.numpy())
        if self.config.eval_data.files and on_any_worker(self.strategy, logs.last_eval.get("step") != step):
            reached = self._evaluate_and_log(logs, step, logs.last_record.get("seconds", 0.0)) or reached
        if self.is_chief:
            path = export_google_checkpoint(self.model, self.directory.exported_weights(step), step)
            logging.debug("weights exported as %s (google-research/MLPerf TF1 names: an --init_checkpoint)", path)
        logs.mlperf.run_stop(sequences, reached)
        info = self.directory.read_info()
        self.directory.write_info({**info, "finished": {"step": step, "reached": reached}})

    def _save(self) -> None:
        """A checkpoint of the current step (unless there is one), with the logs' sizes now."""
        self.log_sizes.assign(self.directory.log_sizes())
        self.checkpoints.save(int(self.step.numpy()), self.model.trainable_variables)

    @contextlib.contextmanager
    def _stop_signals(self):
        """SIGTERM (preemption) and SIGINT (Ctrl-C) stop the loop at the end of its compiled call,
        after a save."""

        def stop(signum, frame):
            self.stopped_by = signal.Signals(signum).name

        previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def evaluate_only(self) -> dict:
        """Evaluates the newest checkpoint of output_dir, or else init_checkpoint; writes the
        result to eval_results.txt and returns it. A training run in output_dir is left alone (the
        reference evaluates beside a running training job)."""
        source = self.checkpoints.restore()
        if source is None:
            if not self.config.model.init_checkpoint:
                raise TrainingError(f"nothing to evaluate: no checkpoint in {self.checkpoints.directory} and no "
                                    f"--init_checkpoint")
            source = self.config.model.init_checkpoint
            load_google_checkpoint(self.model, source)
            self.step.assign(checkpoint_step(source))
        metrics = self.evaluate()
        record = {"step": int(self.step.numpy()), "sequences": int(self.sequences.numpy()), "checkpoint": source,
                  **metrics}
        if self.is_chief:  # eval_results.txt only: a training run may be writing its logs here meanwhile
            files.makedirs(self.directory.path)
            self.directory.write_eval_results(record)
        logging.debug("eval of %s: mlm accuracy %.4f, loss %.4f over %d sequences", source,
                     metrics.get("mlm_accuracy", 0.0), metrics.get("loss", 0.0), metrics.get("num_sequences", 0))
        return record
