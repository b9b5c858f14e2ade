"""The run: train_and_evaluate, the MLPerf recipe's loop top to bottom, and evaluate_only.

train_and_evaluate(config, train_data, eval_data, step) runs, in order:
  1. claim the run directory: refuse one that holds another run, or this run on other data;
     record this one (run.json, flags.txt);
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

What it uses: a CompiledStep (step.py: the model, optimizer and compiled update, built once per
graph shape), the data's description (data.py), checkpoints, logs and mlperf_log (what is
logged), and bert_packed.storage.run_directory (the files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import threading
import time

import numpy as np

from bert_packed.errors import InternalError, TrainingError
from bert_packed.inputs.dataset_info import METADATA_FILE
from bert_packed.inputs.file_identity import DataChangedError, check_unchanged
from bert_packed.model import export_google_checkpoint, export_huggingface
from bert_packed.model.checkpoint import checkpoint_step
from bert_packed.model.huggingface import CONFIG_FILE
from bert_packed.storage import files
from bert_packed.storage.output_job import TRAINING_RUN, claimed, refuse_other_output
from bert_packed.storage.run_directory import RunDirectory
from bert_packed.training.batching import describe_run, eval_every_samples
from bert_packed.training.checkpoints import Checkpoints
from bert_packed.training.config import TrainConfig, require_divides
from bert_packed.training.data import EvalData, TrainData, eval_pipeline, train_pipeline
from bert_packed.training.distribution import chief, common_step, on_any_worker
from bert_packed.training.input_pipeline import WATCHED_SINCE, reading_errors_named
from bert_packed.training.logs import RunLogs
from bert_packed.training.step import CompiledStep

# What stopped a worker that no signal reached: a signal to another worker of its cluster.
BY_ANOTHER_WORKER = "a signal to another worker"


@dataclasses.dataclass
class RunResult:
    """How a run ended.

    Attributes:
      record: the last train record ({} when none).
      step: the micro-step it ended at.
      stopped_by: "SIGTERM" or "SIGINT" when a signal stopped it after a save (the same command
        resumes), BY_ANOTHER_WORKER when a signal stopped another worker of its cluster (and so
        this one, after the same update), else None.
      directory: where this process wrote (the chief: output_dir).
    """

    record: dict
    step: int
    stopped_by: str | None
    directory: RunDirectory


def run_directory(config: TrainConfig, step: CompiledStep) -> RunDirectory:
    """Where this process writes: output_dir for the chief, a directory of its own for another worker."""
    is_chief, task = chief(step.strategy)
    root = RunDirectory(config.run.output_dir)
    return root if is_chief else root.worker(task)


def train_and_evaluate(config: TrainConfig, train_data: TrainData, eval_data: EvalData, step: CompiledStep) -> RunResult:
    """Runs (or resumes) training to num_train_steps or the target accuracy (module docstring)."""
    directory = run_directory(config, step)
    checkpoints = Checkpoints(directory.checkpoints, step.state, config.run.keep_checkpoint_max)
    with claimed(directory.path, step.objective.program, TRAINING_RUN):
        previous = _claim(directory, config, train_data, eval_data, step)
        if _resume(directory, config, step, checkpoints, previous):
            if not _export_if_new(directory, config, step):
                logging.info("%s: finished at step %d; nothing to do", config.run.output_dir, int(step.step.numpy()))
            return RunResult(RunLogs.last_train_record(directory), int(step.step.numpy()), None, directory)
        logs = RunLogs(directory, mlperf=step.objective.mlperf, unit=step.objective.unit)
        try:
            _start(logs, config, train_data, eval_data, step)
            n, every = config.batch.steps_per_update, eval_every_samples(config, step.batching)
            current, sequences = int(step.step.numpy()), int(step.sequences.numpy())
            next_eval = (sequences // every + 1) * every if every else None
            pipeline = train_pipeline(train_data, config, step.batching, current)
            start, first_step, stop = time.perf_counter(), current, Stop(step.update.stop_requested)
            with stop.on_signals():
                reached = _reached_when_resumed(logs, config, eval_data, step, every)
                training = current < config.last_step and not on_any_worker(step.strategy, reached)
                if training and logs.mlperf:
                    logs.mlperf.block_start(sequences)
                iterator = step.train_iterator(pipeline) if training else None
                stopping = stop.agreed(step.strategy)
                while training and current < config.last_step and not stopping:
                    if current == first_step:
                        logging.debug("compiling the training step and running the first %d micro-steps",
                                      min(config.loop_steps, config.last_step - current))
                    with reading_errors_named(pipeline):
                        results = step.run_updates(iterator, min(config.loop_steps, config.last_step - current) // n)
                    seconds = logs.seconds_before + time.perf_counter() - start
                    if current == first_step:
                        logging.debug("compiled and ran the first loop in %.1f s", seconds - logs.seconds_before)
                    current, sequences = _log_updates(results, current, sequences, seconds, first_step, config, logs,
                                                      step, checkpoints)
                    stopping = stop.agreed(step.strategy)
                    if next_eval is not None and sequences >= next_eval and eval_data.files and not stopping:
                        next_eval = (sequences // every + 1) * every
                        reached = bool(_evaluate_and_log(logs, config, eval_data, step, seconds))
                        if reached:
                            break
                        stopping = stop.agreed(step.strategy)  # a signal abandoned it?
                        if current < config.last_step and logs.mlperf:
                            logs.mlperf.block_start(sequences)
                    if current and (current % config.save_steps == 0 or stopping):  # step 0 is the start: nothing to keep
                        _save(directory, checkpoints, step, train_data)
            if stopping and not reached:
                logging.debug("%s: saved step %d", stop.by, current)  # the command says so, with its status
                return RunResult(logs.last_record, current, stop.by, directory)
            _finish(directory, logs, config, train_data, eval_data, step, checkpoints, reached)
            if stop.by:  # it came during the evaluation that reached the target: nothing to resume
                logging.info("%s came as the run finished; it is complete", stop.by)
            return RunResult(logs.last_record, current, None, directory)
        finally:
            logs.close()


def evaluate_only(config: TrainConfig, eval_data: EvalData, step: CompiledStep) -> dict:
    """Evaluates the newest checkpoint of output_dir, or else init_checkpoint; writes the result to
    eval_results.txt and returns it. A training run in output_dir is left alone (the reference
    evaluates beside a running training job)."""
    directory, source = _restored(config, step)
    metrics = _checked(step.evaluate(eval_pipeline(eval_data, config)), eval_data, config)
    record = {"step": int(step.step.numpy()), "sequences": int(step.sequences.numpy()), "checkpoint": source, **metrics}
    if chief(step.strategy)[0]:  # eval_results.txt only: a training run may be logging here meanwhile
        files.makedirs(directory.path)
        directory.write_eval_results(record)
    logging.debug("eval of %s: %s", source, step.objective.describe(metrics))
    return record


def predict_only(config: TrainConfig, test_data: EvalData, step: CompiledStep) -> tuple[str, dict]:
    """What the newest checkpoint of output_dir (or else init_checkpoint) outputs for each example
    of `test_data` (unlabelled: --do_predict's), gathered from every replica; writes nothing.

    Returns:
      (the checkpoint, the objective's example outputs: {name: [N, ...]}).
    """
    _, source = _restored(config, step)
    outputs = step.outputs(eval_pipeline(test_data, config))
    if outputs is None:
        raise TrainingError("stopped by a signal while predicting; the same command predicts again")
    return source, outputs[1]


def _restored(config: TrainConfig, step: CompiledStep) -> tuple[RunDirectory, str]:
    """(where this process writes, the checkpoint) once `step` holds the weights an evaluation
    reads: the newest checkpoint of output_dir, else init_checkpoint. A directory of another kind
    of output (data, an exported model), which its results would be mixed into, is refused."""
    directory = run_directory(config, step)
    refuse_other_output(directory.path, TRAINING_RUN)  # unlocked: it reads beside a running training job
    checkpoints = Checkpoints(directory.checkpoints, step.state, config.run.keep_checkpoint_max)
    require_divides("--eval_batch_size", config.eval.eval_batch_size, step.strategy.num_replicas_in_sync)
    trained_with = directory.read_info().get("nsp_loss")  # the model's heads: its checkpoints hold no other
    if trained_with is not None and trained_with != config.model.nsp_loss:
        raise TrainingError(f"{directory.file('run.json')}: the run was trained with --nsp_loss="
                            f"{str(trained_with).lower()}; give it to evaluate the run's checkpoints")
    source = checkpoints.restore()
    if source is None:
        if not config.model.init_checkpoint:
            raise TrainingError(f"nothing to evaluate: no checkpoint in {checkpoints.directory} and no "
                                f"--init_checkpoint")
        source = config.model.init_checkpoint
        step.objective.load_initial_weights(step.model, source)
        step.step.assign(checkpoint_step(source))
    return directory, source


class Stop:
    """SIGTERM (preemption) and SIGINT (Ctrl-C) stop the run after the update in hand, whatever
    --iterations_per_loop, then it saves.

    While a compiled loop runs, the main thread is inside TensorFlow and Python's own handler only
    runs once the loop returns. So the signal is also written to a pipe (signal.set_wakeup_fd),
    where a thread sees it at once, says so, and sets the flag the compiled loop reads before each
    update (Update.stop_requested).

    Attributes:
      by: "SIGTERM" or "SIGINT" once one came, BY_ANOTHER_WORKER once agreed() found another
        worker's, else None.
    """

    def __init__(self, flag):
        self.by = None
        self._flag = flag  # Update.stop_requested
        self._lock = threading.RLock()  # the watcher and Python's handler (re-entered by a second signal)

    def _stop(self, signum: int) -> None:
        with self._lock:
            if self.by is not None:
                return
            self.by = signal.Signals(signum).name
        self._flag.assign(1)
        logging.info("%s: stopping after the update in hand, then saving a checkpoint", self.by)

    def agreed(self, strategy) -> bool:
        """Whether a signal reached any worker of `strategy`'s cluster; every worker asks after the
        same update, so that all stop there (one that a signal reached alone would leave the others
        waiting in the next loop's collectives, then failing). A worker stopped by another's signal
        says so in `by` (BY_ANOTHER_WORKER)."""
        if not on_any_worker(strategy, self.by is not None):
            return False
        with self._lock:
            self.by = self.by or BY_ANOTHER_WORKER
        return True

    @contextlib.contextmanager
    def on_signals(self):
        numbers = (signal.SIGTERM, signal.SIGINT)
        self._flag.assign(0)
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)

        def watch():
            while data := os.read(read_end, 1):
                if data[0] in numbers:
                    self._stop(data[0])

        previous = {number: signal.signal(number, lambda signum, frame: self._stop(signum)) for number in numbers}
        previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        watcher = threading.Thread(target=watch, name="signals", daemon=True)
        watcher.start()
        try:
            yield self
        finally:
            self._flag.assign(0)  # an evaluation after the loop (the last, or evaluate_only) runs whole
            signal.set_wakeup_fd(previous_fd)
            for number, handler in previous.items():
                signal.signal(number, handler)
            os.close(write_end)  # the watcher reads the end and returns
            watcher.join()
            os.close(read_end)


def _claim(directory: RunDirectory, config: TrainConfig, train_data: TrainData, eval_data: EvalData,
           step: CompiledStep) -> dict:
    """Refuses a directory that holds another run, or this run on other data; records this one.
    Returns run.json as found."""
    if eval_data.files:  # what the training batch is held to, here, not at the first evaluation
        require_divides("--eval_batch_size", config.eval.eval_batch_size, step.strategy.num_replicas_in_sync)
    identity = {**config.identity(), **train_data.identity_settings(), **step.objective.identity,
                "rows_per_micro_batch": step.batching.rows_per_micro_batch}  # corrected on these replicas
    if train_data.input_mode == "packed_online":  # another window makes other packs
        identity["online_packing_window"] = config.batch.online_packing_window
    recorded, data, earlier = directory.read_info(), {}, []
    for kind, identities in (("train", train_data.identity), ("eval", eval_data.identity)):
        heads = [entry[2] for entry in directory.recorded_files(recorded, f"{kind}_files")]
        data[f"{kind}_files"] = [now.as_recorded(head) for now, head in zip(identities, heads + [None] * len(identities))]
        if data[f"{kind}_files"] != list(identities):
            earlier.append(kind)
    previous = directory.claim(identity, data)
    if earlier:  # said once the run is known to go on
        logging.warning("%s: begun by an earlier bert-packed, which recorded the first 64 KiB of its %s files: they are "
                        "checked on those (a new run checks all of each file)", directory.path, " and ".join(earlier))
    if config.run.flags_text:
        directory.write_flags(config.run.flags_text)
    if train_data.histogram:  # counted (no metadata.json counts the files): not again
        directory.write_histogram("train", train_data.identity, train_data.histogram)
    return previous


def _resume(directory: RunDirectory, config: TrainConfig, step: CompiledStep, checkpoints: Checkpoints,
            previous: dict) -> bool:
    """Restores the newest checkpoint that restores (else --init_checkpoint) and cuts the logs back
    to it; returns whether the run had finished (then nothing changes)."""
    checkpoints.clean_up()
    resumed = checkpoints.restore(lambda newest, can_restore: common_step(step.strategy, newest, can_restore),
                                  lambda flag: on_any_worker(step.strategy, flag),
                                  config.run.start_over_if_no_checkpoint_restores)
    current = int(step.step.numpy())
    if not resumed and config.model.init_checkpoint:
        read = step.objective.load_initial_weights(step.model, config.model.init_checkpoint)
        logging.info("initialised from %s", read if read == config.model.init_checkpoint
                     else f"{read} (--init_checkpoint={config.model.init_checkpoint})")
    elif not resumed:  # said: a run meant to start from given weights whose flag was lost looks the same
        logging.info("initialised from random weights (--seed=%d): no --init_checkpoint", config.run.seed)
    finished = previous.get("finished") or {}
    done = bool(resumed) and finished.get("step") == current and (current >= config.last_step
                                                                  or finished.get("reached", False))
    if not on_any_worker(step.strategy, not done):
        return True  # the caller says it finished: not "resumed" too
    if resumed:
        logging.info("resumed from %s at step %d", resumed, current)
    directory.cut_logs(step.log_sizes.numpy().tolist(), resumed=bool(resumed))
    if finished:  # it goes on: no longer finished (run.json as claimed, with today's data paths)
        directory.write_info({k: v for k, v in directory.read_info().items() if k != "finished"})
    return False


def _start(logs: RunLogs, config: TrainConfig, train_data: TrainData, eval_data: EvalData, step: CompiledStep) -> None:
    """What a run says and logs once it starts: the MLPerf parameters (once a run), the notes."""
    if logs.mlperf and not logs.mlperf.started:
        logs.mlperf.run_parameters(config, step.batching, train_data.num_sequences)
    for note in config.rounding_notes(bool(eval_data.files)):
        logging.warning("%s", note)
    for line in describe_run(config, step.batching):
        logging.info("%s", line)
    if not eval_data.files and logs.mlperf:
        logging.warning("this run does not evaluate (no eval files): its mllog.txt cannot pass the MLPerf "
                        "compliance checker, which requires an evaluation (eval_accuracy)")


def _log_updates(results: np.ndarray, current: int, sequences: int, seconds: float, first_step: int,
                 config: TrainConfig, logs: RunLogs, step: CompiledStep, checkpoints: Checkpoints) -> tuple[int, int]:
    """Logs a compiled loop's updates (`results`, a row each), says the progress and sets the
    step's counters; returns the micro-step and the sequences trained after them."""
    for row in results:
        current += config.batch.steps_per_update
        logs.train(_train_record(row, current, sequences, seconds, logs, step, checkpoints))
        sequences = logs.last_record["sequences"]
    if len(results):
        logs.say_progress(config, first_step, len(results), seconds)
    step.step.assign(current)
    step.sequences.assign(sequences)
    return current, sequences


def _train_record(row: np.ndarray, step: int, sequences_before: int, seconds: float, logs: RunLogs,
                  compiled: CompiledStep, checkpoints: Checkpoints) -> dict:
    """One update's train record, after checking its loss and gradient are finite."""
    sums = dict(zip(compiled.update.sum_keys, row[1:].tolist()))
    metrics = compiled.objective.metrics({k: sums[k] for k in compiled.objective.sum_keys})
    for what, value in (("loss", metrics["loss"]), ("the gradient norm", sums["gradient_norm"])):
        if not math.isfinite(value):
            raise TrainingError(f"{what} is {value} at step {step}; stopped without saving, the last good "
                                f"checkpoint is {checkpoints.last_finite()}")
    return {"step": step, "sequences": sequences_before + int(metrics["num_sequences"]),
            "learning_rate": float(row[0]), "seconds": seconds,
            "train_seconds": logs.train_seconds_before + seconds - logs.seconds_before - logs.eval_seconds,
            "real_tokens": sums["tokens"], **({"predictions": sums["mlm_predictions"]} if "mlm_predictions" in sums else {}),
            "padding_efficiency": sums["tokens"] / sums["slots"], "gradient_norm": sums["gradient_norm"], **metrics}


def _reached_when_resumed(logs: RunLogs, config: TrainConfig, eval_data: EvalData, step: CompiledStep,
                          every: int | None) -> bool:
    """Whether the run, as it starts or resumes, has reached the target accuracy: at its last
    evaluation, or at the one due when a signal stopped it (before the evaluation or during it, so
    that it stopped in seconds), which is done now."""
    current, sequences, last = int(step.step.numpy()), int(step.sequences.numpy()), logs.last_eval
    if last.get("step") == current and step.objective.reached(last, config):
        return True
    due = bool(every and eval_data.files and sequences >= every
               and last.get("sequences", -1) < sequences // every * every)
    return on_any_worker(step.strategy, due) and bool(_evaluate_and_log(logs, config, eval_data, step,
                                                                        logs.seconds_before))


def _evaluate_and_log(logs: RunLogs, config: TrainConfig, eval_data: EvalData, step: CompiledStep,
                      seconds: float) -> bool | None:
    """Evaluates and logs; returns whether the target accuracy is reached, None when a signal
    stopped the evaluation (nothing logged)."""
    current, sequences = int(step.step.numpy()), int(step.sequences.numpy())
    logging.debug("evaluating at step %d (%d sequences trained)", current, sequences)
    start = time.perf_counter()
    metrics = step.evaluate(eval_pipeline(eval_data, config))
    if metrics is None:
        logging.debug("the evaluation at step %d was stopped; the run does it when it resumes", current)
        return None
    metrics = _checked(metrics, eval_data, config)
    logs.eval_seconds += time.perf_counter() - start
    logs.eval({"step": current, "sequences": sequences, "seconds": seconds, **metrics})
    if logs.mlperf:
        logs.mlperf.evaluation(sequences, metrics.get("mlm_accuracy", 0.0), int(metrics.get("num_sequences", 0)))
    logging.info("eval at step %d (%d %s seen): %s, in %.1f s", current, sequences, step.objective.unit,
                 step.objective.describe(metrics),
                 time.perf_counter() - start)
    reached = step.objective.reached(metrics, config)
    if reached:
        logging.info("target mlm accuracy %.3f reached at step %d after %d sequences", config.eval.target_mlm_accuracy,
                     current, sequences)
    return reached


def _checked(metrics: dict, eval_data: EvalData, config: TrainConfig) -> dict:
    """An evaluation's metrics, once it is known to have counted every eval sequence once (a figure
    over no sequences, or over others, would reach the logs and mllog.txt)."""
    evaluated = int(metrics.get("num_sequences", 0))
    if not evaluated:
        raise TrainingError(f"the evaluation counted no sequence of {', '.join(eval_data.files[:3])}: nothing to "
                            f"measure accuracy on; give eval files that hold sequences")
    whole = config.eval.max_eval_steps is None
    if whole and eval_data.num_sequences and evaluated != eval_data.num_sequences:
        raise InternalError(f"the evaluation counted {evaluated:,} sequences, but the eval files hold "
                            f"{eval_data.num_sequences:,} (their {METADATA_FILE}): each must count once; nothing of "
                            f"it was logged")
    return metrics


def _finish(directory: RunDirectory, logs: RunLogs, config: TrainConfig, train_data: TrainData, eval_data: EvalData,
            step: CompiledStep, checkpoints: Checkpoints, reached: bool) -> None:
    """The end of the run: the last checkpoint, an evaluation at the last step (so that every run's
    final figure is at its last step), the weights as a TF1 checkpoint, and run_stop."""
    _save(directory, checkpoints, step, train_data)
    current, sequences = int(step.step.numpy()), int(step.sequences.numpy())
    if eval_data.files and on_any_worker(step.strategy, logs.last_eval.get("step") != current):
        reached = _evaluate_and_log(logs, config, eval_data, step, logs.last_record.get("seconds", 0.0)) or reached
    if chief(step.strategy)[0]:
        path = export_google_checkpoint(step.model, directory.exported_weights(current), current)
        logging.debug("weights exported as %s (google-research/MLPerf TF1 names: an --init_checkpoint)", path)
        if config.run.export_huggingface_dir:
            _export(config, step)
    if logs.mlperf:
        logs.mlperf.run_stop(sequences, reached)
    exported = {"huggingface_dir": config.run.export_huggingface_dir} if config.run.export_huggingface_dir else {}
    directory.write_info({**directory.read_info(), "finished": {"step": current, "reached": reached, **exported}})


def _export(config: TrainConfig, step: CompiledStep) -> None:
    export_huggingface(step.model, config.run.export_huggingface_dir, config.run.vocab_file, config.run.do_lower_case,
                       step.objective.labels)
    logging.info("weights exported as a Hugging Face BERT directory: %s", config.run.export_huggingface_dir)


def _export_if_new(directory: RunDirectory, config: TrainConfig, step: CompiledStep) -> bool:
    """A finished run given an --export_huggingface_dir it has not exported to (whole) exports its
    last weights there (restored from its last checkpoint); returns whether it did."""
    wanted = config.run.export_huggingface_dir
    if not wanted or not chief(step.strategy)[0]:
        return False
    info = directory.read_info()
    finished = info.get("finished") or {}
    done = finished.get("huggingface_dir")
    if done and files.absolute(done) == files.absolute(wanted) and files.exists(os.path.join(wanted, CONFIG_FILE)):
        return False
    logging.info("%s: finished at step %d; exporting its weights to the new --export_huggingface_dir",
                 config.run.output_dir, int(step.step.numpy()))
    _export(config, step)
    directory.write_info({**info, "finished": {**finished, "huggingface_dir": wanted}})
    return True


def _save(directory: RunDirectory, checkpoints: Checkpoints, step: CompiledStep, train_data: TrainData) -> None:
    """A checkpoint of the current step (unless there is one), with the logs' sizes now; only while
    every training file is what the run started with, so that no checkpoint holds what was read
    from a file changed under the run (tf.data opens each file again every epoch, unwatched)."""
    try:
        check_unchanged(train_data.identity, WATCHED_SINCE)
        changed = None
    except DataChangedError as e:
        changed = e
    if on_any_worker(step.strategy, changed is not None):  # each worker reads its own share: stop together
        raise changed or DataChangedError(f"a training file changed since {WATCHED_SINCE}, as another worker "
                                          f"found (its log names it); the run stopped without saving")
    step.log_sizes.assign(directory.log_sizes())
    checkpoints.save(int(step.step.numpy()), step.model.trainable_variables)
