"""What a training run logs as it goes: train and eval records (JSON lines), TensorBoard scalars
and the MLPerf log, with the run's clocks continued across restarts."""

from __future__ import annotations

import json
import logging

import tensorflow as tf

from bert_packed.console.progress import duration
from bert_packed.storage import files
from bert_packed.storage.run_directory import EVAL_LOG, TRAIN_LOG, RunDirectory
from bert_packed.training.mlperf_log import MLPerfLog


class RunLogs:
    """The logs of one run directory, continued from what it holds.

    Attributes:
      mlperf: the MLPerf log (None for a run that keeps none: a fine-tuning run).
      last_record: the last train record logged.
      last_eval: the last eval record logged ({} when none).
      seconds_before: the run's clock when this process started (from the last train record).
      train_seconds_before: the same for the clock without evaluations.
      eval_seconds: seconds this process spent evaluating.
      last_progress: (the run's clock, sequences, real tokens) at the last progress line.
    """

    def __init__(self, directory: RunDirectory, mlperf: bool = True, unit: str = "sequences"):
        train, evals = directory.read_log(TRAIN_LOG), directory.read_log(EVAL_LOG)
        self.last_record = train[-1] if train else {}
        self.last_eval = evals[-1] if evals else {}
        self.seconds_before = self.last_record.get("seconds", 0.0)
        self.train_seconds_before = self.last_record.get("train_seconds", 0.0)
        self.eval_seconds = 0.0
        self.tokens = sum(record.get("real_tokens", 0.0) for record in train)
        self.last_progress = (self.seconds_before, self.last_record.get("sequences", 0), self.tokens)
        self._first_loop_end = None  # (the run's clock less evaluations, step) after this start's first loop
        self.mlperf = MLPerfLog(directory) if mlperf else None
        self.unit = unit  # what the progress lines count: pre-training's sequences, fine-tuning's examples
        self._train = directory.open_log(TRAIN_LOG)
        self._eval = directory.open_log(EVAL_LOG)
        self._tensorboard = directory.tensorboard
        with files.storage(self._tensorboard):  # TensorFlow writes the event files itself
            self._writer = tf.summary.create_file_writer(self._tensorboard)

    @staticmethod
    def last_train_record(directory: RunDirectory) -> dict:
        """The last train record a run directory holds ({} when none)."""
        records = directory.read_log(TRAIN_LOG)
        return records[-1] if records else {}

    def train(self, record: dict) -> None:
        self._append(self._train, record)
        previous, self.last_record = self.last_record, record
        self.tokens += record["real_tokens"]
        scalars = {name: record[name] for name in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate",
                                                   "gradient_norm", "padding_efficiency") if name in record}
        seconds = record["train_seconds"] - previous.get("train_seconds", 0.0)
        if seconds > 0:  # since the previous record (of this update, or of the last before a resume)
            scalars["sequences_per_second"] = (record["sequences"] - previous.get("sequences", 0)) / seconds
            scalars["real_tokens_per_second"] = record["real_tokens"] / seconds
        with self._writer.as_default():
            for name, value in scalars.items():
                tf.summary.scalar(f"train/{name}", value, step=record["step"])
                # Packed and padded runs line up against sequences seen, not steps.
                tf.summary.scalar(f"train_by_sequences/{name}", value, step=record["sequences"])

    def eval(self, record: dict) -> None:
        self._append(self._eval, record)
        self.last_eval = record
        with self._writer.as_default():
            for name in ("loss", "mlm_accuracy", "nsp_accuracy"):
                if name in record:  # no nsp_accuracy without the next-sentence head
                    tf.summary.scalar(f"eval/{name}", record[name], step=record["step"])
                    tf.summary.scalar(f"eval_by_sequences/{name}", record[name], step=record["sequences"])

    def say_progress(self, config, first_step: int, num_updates: int, seconds: float) -> None:
        """A progress line after a compiled loop of `num_updates` updates that crossed a multiple of
        --log_every_steps (or ended the run): step/total, rates, padding efficiency, time left."""
        record, every, last = self.last_record, config.run.log_every_steps, config.last_step
        step = record["step"]
        if self._first_loop_end is None:  # the first loop holds the compilation: the time left is timed after it
            self._first_loop_end = (seconds - self.eval_seconds, step)
        if step // every == (step - config.batch.steps_per_update * num_updates) // every and step != last:
            return
        before_seconds, before_sequences, before_tokens = self.last_progress
        interval = max(seconds - before_seconds, 1e-9)
        self.last_progress = (seconds, record["sequences"], self.tokens)
        timed_seconds, timed_step = self._first_loop_end
        if step >= last:
            left = ""
        elif step > timed_step:
            per_step = (seconds - self.eval_seconds - timed_seconds) / (step - timed_step)
            left = f", about {duration((last - step) * per_step)} left"
        else:
            left = ", time left: after the next loop (this one compiled the step)"
        accuracy = next((f", {name.replace('_', ' ')} {record[name]:.4f}" for name in ("mlm_accuracy", "accuracy")
                         if name in record), "")  # a fine-tuning regression has none
        logging.info("step %d/%d: loss %.4f%s, %d %s (%.1f/s, %.0f real tokens/s, padding efficiency %.1f%%)%s",
                     step, last, record["loss"], accuracy, record["sequences"], self.unit,
                     (record["sequences"] - before_sequences) / interval, (self.tokens - before_tokens) / interval,
                     100 * record["padding_efficiency"], left)

    @staticmethod
    def _append(file, record: dict) -> None:
        file.write(json.dumps(record) + "\n")
        file.flush()

    def close(self) -> None:
        for file in (self._train, self._eval):
            file.close()
        if self.mlperf:
            self.mlperf.close()
        with files.storage(self._tensorboard):
            self._writer.close()

