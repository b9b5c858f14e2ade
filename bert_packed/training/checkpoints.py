"""A run's TensorFlow checkpoints: save, restore the newest that restores, keep the newest few.

A checkpoint `checkpoints/ckpt-<step>` holds what a resumed run needs to continue exactly: the
model, the optimizer, the step, the sequences seen, dropout's random state, and the sizes of the
run's logs when it was saved (run_directory.cut_logs).

Saving is atomic. TensorFlow writes the checkpoint under `checkpoints/.saving/`, and its files
move into place data first, index last: a checkpoint exists when its .index does, and then it is
whole. A kill at any moment leaves the new checkpoint or none of it; what it left in .saving/ is
removed at the next start. Weights that are not finite are never saved. After a save the state
file `checkpoint` (read by TensorFlow's own tools, tf.train.latest_checkpoint) names the newest,
and checkpoints beyond keep_checkpoint_max are deleted, oldest first.

Restoring lists the directory (never a pattern, so any path works) and tries the checkpoints
newest first. Each is read whole before anything is assigned (every tensor's checksum is
checked), so a damaged one, say a torn .index, is passed over with one line and leaves the model
untouched. When checkpoints are there and none restores, the run stops with one line naming them:
on a bucket a read can fail and succeed when tried again, and starting over would empty the
run's logs. Starting over is then the user's call (--start_over_if_no_checkpoint_restores).
"""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import tensorflow as tf

from bert_packed.errors import TrainingError, raise_if_retryable
from bert_packed.model import BertEncoder, BertPretrainingModel, load_google_checkpoint
from bert_packed.model.checkpoint import CheckpointError, copy_weights, google_variable_names, newest_exported_step
from bert_packed.model.huggingface import MODEL_SETTINGS
from bert_packed.storage import files
from bert_packed.storage.run_directory import RunDirectory, program_of

_CHECKPOINT = re.compile(r"^ckpt-(\d+)\.index$")


class Checkpoints:
    """The checkpoints of one run directory (or one worker's).

    Attributes:
      directory: where they are (`output_dir/checkpoints`).
      keep: how many are kept.
    """

    def __init__(self, directory: str, checkpoint: tf.train.Checkpoint, keep: int):
        self.directory = directory
        self.keep = keep
        self._checkpoint = checkpoint
        self._saving = os.path.join(directory, ".saving")
        self._state_file = os.path.join(directory, "checkpoint")  # TensorFlow's tools read it
        self._whole: set[int] = set()  # steps this process saved or restored: known to read whole

    def clean_up(self) -> None:
        """Removes what a save cut short left (call holding the run's lock): .saving/ (with
        TensorFlow's own temporary files) and data files moved in without their index."""
        files.rmtree(self._saving)
        files.remove_leftovers(self.directory)  # a state file's temporary one
        names = files.listdir(self.directory)
        indexed = {name[:-len(".index")] for name in names if name.endswith(".index")}
        for name in names:
            if name.startswith("ckpt-") and ".data-" in name and name.split(".data-")[0] not in indexed:
                files.remove(os.path.join(self.directory, name))

    def steps(self) -> list[int]:
        """The steps of the checkpoints on disk, newest first."""
        found = (_CHECKPOINT.match(name) for name in files.listdir(self.directory))
        return sorted((int(match.group(1)) for match in found if match), reverse=True)

    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"ckpt-{step}")

    @property
    def latest(self) -> str | None:
        steps = self.steps()
        return self.path(steps[0]) if steps else None

    def save(self, step: int, variables: list) -> str:
        """Saves checkpoint `step` unless this process saved or restored it; one on disk that
        restore passed over (damaged) is replaced. Never saves weights that are not finite.

        Args:
          step: the micro-step (the checkpoint's number).
          variables: the weights checked finite first.

        Raises:
          TrainingError: a weight is not finite (nothing saved).
        """
        target = self.path(step)
        if step in self._whole and step in self.steps():
            return target
        # One reduction and one read back, not one per variable.
        if not bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])):
            raise TrainingError(f"the weights at step {step} are not finite; not saved, the last good checkpoint is "
                                 f"{self.last_finite()}")
        files.rmtree(self._saving)
        files.makedirs(self._saving)
        self._remove(step)  # one restore passed over: its parts are replaced, not mixed with the new ones
        try:
            with files.storage(self.directory):  # TensorFlow writes the checkpoint's files itself
                self._checkpoint.write(os.path.join(self._saving, f"ckpt-{step}"))
            for part in sorted(files.listdir(self._saving), key=lambda part: part.endswith(".index")):  # index last
                files.move(os.path.join(self._saving, part), os.path.join(self.directory, part))
        finally:
            files.rmtree(self._saving)
        self._whole.add(step)
        self._prune()
        self._write_state_file()
        return target

    def _prune(self) -> None:
        for step in self.steps()[self.keep:]:
            self._remove(step)

    def _remove(self, step: int) -> None:
        prefix = f"ckpt-{step}."
        for name in sorted(files.listdir(self.directory), key=lambda part: not part.endswith(".index")):
            if name.startswith(prefix):  # the index first: what is left is never mistaken for a checkpoint
                files.remove(os.path.join(self.directory, name))

    def _write_state_file(self) -> None:
        steps = self.steps()
        if not steps:
            return
        lines = [f'model_checkpoint_path: "ckpt-{steps[0]}"'] + [
            f'all_model_checkpoint_paths: "ckpt-{step}"' for step in reversed(steps)]
        files.write_text_atomically(self._state_file, "\n".join(lines) + "\n")

    def restore(self, agree=lambda newest, can_restore: newest, any_worker=lambda flag: flag,
                start_over: bool = False) -> str | None:
        """Restores the newest checkpoint that reads whole; returns its path, or None when there is
        none (then nothing is assigned: the run starts from its initial weights).

        Args:
          agree: (this process's newest readable step, 0 for none; can_restore(step) -> bool) ->
            the step to restore. Several workers each read their own checkpoints, and a kill can
            come between two workers' saves: they agree on a step all of them can restore (0:
            none).
          any_worker: whether a flag holds on any worker (distribution.on_any_worker).
          start_over: when checkpoints are there and none restores, return None (start over)
            instead of raising.

        Raises:
          TrainingError: checkpoints are there (on any worker) and none restores, unless
            `start_over`; or a checkpoint read whole does not fit the run's objects.
        """
        problems, readable = [], []
        for step in self.steps():
            problem = _unreadable(self.path(step))
            if problem:
                problems.append(f"{os.path.basename(self.path(step))} ({problem})")
                logging.warning("%s: cannot restore this checkpoint (%s); trying an older one", self.path(step),
                                problem)
                continue
            readable.append(step)
            break  # the newest that reads whole; older ones are read only if the workers agree on one
        newest = readable[0] if readable else 0
        step = agree(newest, lambda step: step == newest or (step in self.steps()
                                                              and _unreadable(self.path(step)) is None))
        if not step:
            # The state file is written once a save is complete: with it, a checkpoint was whole once.
            if any_worker(bool(self.steps()) or files.exists(self._state_file)):
                why = ", ".join(problems) or (
                    f"{os.path.basename(self.path(newest))} restores here, but not on every worker (another worker's "
                    f"are damaged or of other steps: its own line names them)" if newest else
                    "the state file `checkpoint` is there, but no ckpt-N.index beside it")
                if not start_over:
                    raise TrainingError(
                        f"{self.directory}: no checkpoint restores: {why}. Stopped rather than start over and "
                        f"empty the run's logs: run again if the cause may pass (a storage error), or give "
                        f"--start_over_if_no_checkpoint_restores to train from step 0")
                logging.warning("no checkpoint of %s restores (%s): starting over from step 0, as "
                                "--start_over_if_no_checkpoint_restores asks", self.directory, why)
            return None
        path = self.path(step)
        self.read(path, "use a new --output_dir")
        self._whole.add(step)
        if problems:
            logging.warning("resumed from %s, the newest checkpoint that restores", path)
        self._repair_state_file(step)
        return path

    def read(self, path: str, remedy: str) -> None:
        """Assigns the checkpoint at `path` to the objects given (they may be a part of what it
        holds: the model alone, say).

        Raises:
          TrainingError: it lacks one of the objects, or does not fit one; `remedy` says what to do.
        """
        try:
            with files.unglobbed(path) as plain:
                self._checkpoint.read(plain).assert_existing_objects_matched().expect_partial()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise_if_retryable(files.storage_error(e, path))
            raise TrainingError(f"{path}: does not fit this run ({str(e).splitlines()[0]}); {remedy}") from None

    def _repair_state_file(self, step: int) -> None:
        """Rewrites the state file when it does not name the newest checkpoint (damaged, or left by
        a save cut short), so that TensorFlow's tools find what the run resumed from."""
        path = self._state_file
        if files.exists(path):
            with files.open_file(path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
            if f'model_checkpoint_path: "ckpt-{step}"' in text.splitlines()[:1]:
                return
            logging.warning("%s: damaged or out of date (it does not name ckpt-%d, the newest); rewritten", path,
                            step)
        self._write_state_file()

    def last_finite(self) -> str:
        """The newest checkpoint whose every float tensor is finite (read back to check), named."""
        for step in self.steps():
            path = self.path(step)
            try:
                with files.unglobbed(path) as readable:
                    reader = tf.train.load_checkpoint(readable)
                    if all(np.isfinite(reader.get_tensor(name)).all() for name, dtype in
                           reader.get_variable_to_dtype_map().items() if dtype.is_floating):
                        return path
            except Exception:  # noqa: BLE001 - unreadable: not a good checkpoint either
                continue
        return "none: no checkpoint was saved yet"


def load_run_weights(model, run_dir: str, step: int | None = None) -> tuple[str, int]:
    """Loads a run directory's weights into `model`: those of `step` (a training checkpoint), or
    else its newest, the exported `model.ckpt-N` (a finished run's) or the newest training
    checkpoint that reads whole, whichever is of the later step (the export on a tie; a damaged
    export falls back to the training checkpoints, saying so).

    Returns:
      (the checkpoint read, its step).

    Raises:
      TrainingError: the model's config is not the run's (run.json), the directory holds no
        weights, or none reads whole.
    """
    directory = RunDirectory(run_dir)
    recorded = directory.read_info().get("bert")
    if recorded:
        differing = next((name for name in MODEL_SETTINGS  # what the weights compute (not dropout, say)
                          if recorded.get(name, getattr(model.config, name)) != getattr(model.config, name)), None)
        if differing:
            raise TrainingError(f"{directory.file('run.json')}: the run's {differing} is {recorded[differing]!r}, but "
                                f"--bert_config_file says {getattr(model.config, differing)!r}")
    exported = newest_exported_step(run_dir)
    # A training checkpoint reaches the encoder's weights only through the optimizer (Keras does
    # not put a list of layers in TensorFlow's object graph): its list of the model's trainable
    # variables, built in the model's order (step.CompiledStep), stands in for the optimizer.
    optimizer = tf.train.Checkpoint(_trainable_variables=list(model.trainable_variables))
    checkpoints = Checkpoints(directory.checkpoints, tf.train.Checkpoint(model=model, optimizer=optimizer), keep=1)
    trained = [step] if step is not None else checkpoints.steps()
    if step is None and exported is not None and (not trained or exported >= trained[0]):
        path = directory.exported_weights(exported)
        try:
            load_google_checkpoint(model, path)
            return path, exported
        except CheckpointError:
            problem = _unreadable(path)  # read whole only when loading failed: damaged, or not the model's
            if problem is None:
                raise
        logging.warning("%s: cannot be read (%s); trying the training checkpoints", path, problem)
    for candidate in trained:
        problem = _unreadable(checkpoints.path(candidate))
        if problem is None:
            checkpoints.read(checkpoints.path(candidate), "is --bert_config_file the run's?")
            return checkpoints.path(candidate), candidate
        logging.warning("%s: cannot be read (%s)%s", checkpoints.path(candidate), problem,
                        "; trying an older one" if step is None else "")
    if step is not None:
        raise TrainingError(f"{checkpoints.path(step)}: cannot be read whole")
    raise TrainingError(f"{run_dir}: holds no weights that read whole: neither model.ckpt-N (a finished run's) nor "
                        f"checkpoints/ckpt-N")


def _unreadable(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be read whole (None when it can): every tensor is read,
    which checks its checksum."""
    try:
        with files.unglobbed(path) as readable:
            reader = tf.train.load_checkpoint(readable)
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
    except Exception as e:  # noqa: BLE001 - TensorFlow's reader raises many kinds (IndexError on a short file)
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def run_and_step(checkpoint: str) -> tuple[str | None, int | None]:
    """(the run directory, the step) that `checkpoint` names: a run directory (its newest weights,
    step None), its checkpoints/ folder (the same), or one of its training checkpoints
    (checkpoints/ckpt-N, or one of its files: ckpt-N.index); (None, None) for anything else."""
    checkpoint = checkpoint.rstrip("/")
    match = re.match(r"^(.*)/checkpoints(?:/ckpt-(\d+)(?:\.index|\.data-\d+-of-\d+)?)?/?$", checkpoint)
    for run_dir, step in ((checkpoint, None), *([(match.group(1), match.group(2))] if match else [])):
        directory = RunDirectory(run_dir)
        if directory.holds_run() or (step is None and run_dir == checkpoint and files.isdir(directory.checkpoints)):
            return run_dir, int(step) if step is not None else None
    return None, None


def pretraining_run_info(path: str) -> dict | None:
    """The run.json of the pre-training run `path` names (its directory, its checkpoints/ folder or
    one of its training checkpoints: load_pretraining_checkpoint's); None for any other path."""
    run_dir, _ = run_and_step(path)
    info = RunDirectory(run_dir).read_info() if run_dir is not None else None
    return info if info is not None and program_of(info) == "run_pretraining" else None


def load_pretraining_checkpoint(model: BertEncoder | BertPretrainingModel, path: str) -> str | None:
    """Loads `path` into `model` when it names a pre-training run or one of its training
    checkpoints, as --init_checkpoint takes them: the run's directory or its checkpoints/ folder
    (its newest weights that read whole: load_run_weights), or checkpoints/ckpt-N (or one of its
    files): the run's weights, read as its own model holds them, then copied weight by weight.

    Args:
      model: the model to load (a fine-tuning model's encoder: the run's heads are passed over).
      path: --init_checkpoint.

    Returns:
      The checkpoint read; None when `path` names no pre-training run (a fine-tuning run's
      directory is read as the weights it exported, by the caller).

    Raises:
      CheckpointError: a fine-tuning run's training checkpoint, or one without a weight the model
        needs (a run without the next-sentence head, for a model with one).
      TrainingError: the run holds no weights that read whole, or its model is not `model`'s.
    """
    run_dir, step = run_and_step(path)
    if run_dir is None:
        return None
    info = RunDirectory(run_dir).read_info()
    if program_of(info) != "run_pretraining":
        if step is None:
            return None
        raise CheckpointError(f"{path}: a {program_of(info)} run's training checkpoint (it resumes that run); give "
                              f"the run's directory, whose model.ckpt-N the run exported at its end")
    run_model = BertPretrainingModel(model.config, info.get("nsp_loss", True))
    run_model.build()
    read, _ = load_run_weights(run_model, run_dir, step)
    theirs = {name for name, _, _ in google_variable_names(run_model)}
    missing = [name for name, _, _ in google_variable_names(model) if name not in theirs]
    if missing:
        raise CheckpointError(f"{path}: the run's model has no {', '.join(missing[:3])}"
                              f"{', ...' if len(missing) > 3 else ''} (trained without the next-sentence head?)")
    copy_weights(run_model, model)
    return read

