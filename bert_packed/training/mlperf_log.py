"""The MLPerf log of a run, mllog.txt: the :::MLLOG events the compliance checker reads.

A run logs, in this order: the submission fields and hyper-parameters (closed BERT rules) between
init_start and init_stop, run_start, then blocks of training between evaluations (block_start,
block_stop, eval_start, eval_accuracy, eval_stop), and run_stop. MLPerf counts samples: every
`samples_count` and `epoch_num` here is sequences, never packs.

A resumed run continues the log that its checkpoint's cut left (run_directory.cut_logs): what it
must log next (whether a block is open, whether eval_samples was logged, whether the run has
stopped) is read from the log itself, not kept anywhere else.
"""

from __future__ import annotations

import json
import logging
import os

from mlperf_logging.mllog import mllog

from bert_packed.storage.run_directory import MLLOG, RunDirectory

_PREFIX = ":::MLLOG "


class MLPerfLog:
    """Appends :::MLLOG events to a run directory's mllog.txt (a logger of its own: the package's
    shared mllog logger is left alone).

    Attributes:
      block_open: between a block_start and its block_stop.
      eval_samples_logged: eval_samples is logged once a run.
      stopped: run_stop is logged: the run has ended.
    """

    def __init__(self, directory: RunDirectory):
        events = [json.loads(line[len(_PREFIX):]) for line in directory.read_text(MLLOG).splitlines()
                  if line.startswith(_PREFIX)]
        keys = [event.get("key") for event in events]
        starts = [i for i, key in enumerate(keys) if key == "block_start"]
        stops = [i for i, key in enumerate(keys) if key == "block_stop"]
        self.block_open = bool(starts) and (not stops or starts[-1] > stops[-1])
        self.eval_samples_logged = "eval_samples" in keys
        self.stopped = "run_stop" in keys
        self.started = "run_start" in keys
        self._file = directory.open_log(MLLOG)
        logger = logging.Logger(f"bert_packed.mllog.{id(self)}")  # not registered: private to this log
        logger.addHandler(_LineHandler(self._file))
        self._logger = mllog.MLLogger(logger=logger, root_dir=os.getcwd())

    def event(self, key: str, value=None, metadata: dict | None = None) -> None:
        """One :::MLLOG line; its file and line are the caller's."""
        self._logger.event(key=key, value=value, metadata=metadata, stack_offset=2)

    def run_parameters(self, config, batching, train_samples: int) -> None:
        """The submission fields and hyper-parameters, once a run, from init_start to run_start.

        Args:
          config: the run's TrainConfig.
          batching: what one update holds (config.Batching: the global batch, the betas).
          train_samples: the training data's sequences.
        """
        run, o = config.run, config.optimizer
        for key, value in (
                ("cache_clear", True), ("init_start", None), ("submission_benchmark", "bert"),
                ("submission_division", run.submission_division), ("submission_org", run.submission_org),
                ("submission_platform", run.submission_platform), ("submission_status", run.submission_status),
                ("global_batch_size", round(batching.sequences_per_update)),
                ("packing_factor", batching.packing_factor),
                ("gradient_accumulation_steps", batching.steps_per_update), ("train_samples", train_samples),
                ("opt_base_learning_rate", o.learning_rate), ("opt_lamb_epsilon", o.epsilon),
                ("opt_learning_rate_training_steps", o.num_train_steps),
                ("opt_learning_rate_warmup_steps", o.num_warmup_steps), ("num_warmup_steps", o.num_warmup_steps),
                ("start_warmup_step", o.start_warmup_step), ("opt_lamb_beta_1", batching.betas[0]),
                ("opt_lamb_beta_2", batching.betas[1]), ("opt_lamb_weight_decay_rate", o.lamb_weight_decay_rate),
                ("seed", run.seed), ("init_stop", None), ("run_start", None)):
            self.event(key, value)
        self.started = True

    def block_start(self, sequences: int) -> None:
        """Opens a block of training between evaluations, unless one is open."""
        if not self.block_open:
            self.event("block_start", metadata={"samples_count": sequences, "first_epoch_num": sequences})
            self.block_open = True

    def block_stop(self, sequences: int) -> None:
        if self.block_open:
            self.event("block_stop", metadata={"samples_count": sequences, "first_epoch_num": sequences})
            self.block_open = False

    def evaluation(self, sequences: int, accuracy: float, eval_sequences: int) -> None:
        """An evaluation after `sequences` training sequences (the block before it is closed)."""
        self.block_stop(sequences)
        self.event("eval_start", metadata={"epoch_num": sequences})
        if not self.eval_samples_logged:
            self.event("eval_samples", eval_sequences)
            self.eval_samples_logged = True
        self.event("eval_accuracy", accuracy, {"epoch_num": sequences})
        self.event("eval_stop", metadata={"epoch_num": sequences})

    def run_stop(self, sequences: int, reached: bool) -> None:
        """The end of the run: success when the target accuracy was reached, else aborted."""
        self.block_stop(sequences)
        self.event("run_stop", metadata={"status": "success" if reached else "aborted", "epoch_num": sequences})
        self.stopped = True

    def close(self) -> None:
        self._file.close()


class _LineHandler(logging.Handler):
    """Appends each message as a line to an open file (a gfile too), flushed at once."""

    def __init__(self, file):
        super().__init__()
        self.file = file

    def emit(self, record: logging.LogRecord) -> None:
        self.file.write(record.getMessage() + "\n")
        self.file.flush()
