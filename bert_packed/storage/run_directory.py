"""A training run's directory: the only code that reads or writes its files (through `files`, so a
run on gs:// or any filesystem TensorFlow knows is read the same way).

  run.json           what the run is: input mode, packing factor, batch, seed, the BERT config and
                     the training data's identity. A restart that differs is refused; `finished`
                     is added once the run has ended.
  flags.txt          the command's own flags, as a flagfile
  train_log.jsonl    one JSON object an update: step, sequences, loss, mlm_accuracy, learning_rate,
                     seconds, ...
  eval_log.jsonl     one JSON object an evaluation
  mllog.txt          :::MLLOG lines (mlperf-logging), checked by its compliance checker
  eval_results.txt   an evaluation alone (--do_eval without --do_train), `key = value` lines
  train_histogram.json  the training files' length histogram, when no metadata.json counts them
  model.ckpt-<step>  the final weights with google-research names (.index and .data-*)
  checkpoints/       TensorFlow checkpoints (bert_packed.training.checkpoints)
  tensorboard/       TensorBoard events
  .workers/worker-N  the same, for each non-chief worker of a multi-worker run

The three logs only grow while a run trains. Each checkpoint records their sizes; a resumed run
cuts them back to those sizes (cut_logs), so that what was logged after the checkpoint, which the
resumed run does again, is not logged twice.
"""

from __future__ import annotations

import collections
import json
import logging
import os

from bert_packed.errors import UserError
from bert_packed.storage import files

RUN_INFO = "run.json"
FLAGS = "flags.txt"
TRAIN_LOG = "train_log.jsonl"
EVAL_LOG = "eval_log.jsonl"
MLLOG = "mllog.txt"
EVAL_RESULTS = "eval_results.txt"
# run_squad's answers to its predict file, as google-research's writes them.
PREDICTIONS, NBEST_PREDICTIONS = "predictions.json", "nbest_predictions.json"
TEST_RESULTS = "test_results.tsv"  # run_classifier --do_predict's
# The logs a checkpoint records the sizes of, in this order.
LOGS = (TRAIN_LOG, EVAL_LOG, MLLOG)


class RunError(UserError, ValueError):
    """A run directory lacks what is asked of it, or its files are damaged."""


class RunDirectory:
    """One run's output directory (or one worker's, under multi-worker training).

    Attributes:
      path: the directory.
    """

    def __init__(self, path: str):
        self.path = path

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def checkpoints(self) -> str:
        return self.file("checkpoints")

    @property
    def tensorboard(self) -> str:
        return self.file("tensorboard")

    def worker(self, task_id: int) -> RunDirectory:
        """Where a non-chief worker of a multi-worker run writes."""
        return RunDirectory(os.path.join(self.path, ".workers", f"worker-{task_id}"))

    def exported_weights(self, step: int) -> str:
        """The prefix of the final weights with google-research names."""
        return self.file(f"model.ckpt-{step}")

    def holds_run(self) -> bool:
        """Whether a training run wrote here."""
        return files.exists(self.file(RUN_INFO)) or files.exists(self.file(TRAIN_LOG))

    # ---- run.json and flags.txt
    def read_info(self) -> dict:
        """run.json ({} when there is none yet).

        Raises:
          RunError: it is not a JSON object.
        """
        path = self.file(RUN_INFO)
        if not files.exists(path):
            return {}
        try:
            return files.read_json_object(path)
        except ValueError as e:
            raise RunError(f"{path}: damaged, {e}; use a new --output_dir") from None

    def recorded_files(self, info: dict, key: str) -> list[list]:
        """run.json's record of a run's data files (`key`: train_files, eval_files), as [path,
        bytes, head] lists, which a resume compares entry by entry; [] when there is none.

        Raises:
          RunError: the record is not such a list (edited by hand, say).
        """
        entries = info.get(key, [])
        if not isinstance(entries, list):
            bad = f"{key} is not a list of [path, bytes, head]"
        else:
            index = next((i for i, entry in enumerate(entries) if not _an_identity(entry)), None)
            if index is None:
                return entries
            bad, entries = f"{key} entry {index} is not [path, bytes, head]", entries[index]
        raise RunError(f"{self.file(RUN_INFO)}: damaged, {bad} (found {json.dumps(entries)[:80]}); resuming cannot "
                       f"tell whether the data changed: use a new --output_dir")

    def claim(self, identity: dict, data: dict) -> dict:
        """Records a run in run.json, or refuses: when the directory holds another run (a value of
        `identity` differs) or this run on other data (a file of `data` differs: its name, bytes or
        the hash of its beginning; the directory may have moved). Returns run.json as found.

        Raises:
          RunError: naming what differs.
        """
        previous = self.read_info()
        # The data first: data made again changes what follows from it (the packing factor, say),
        # and the user gave the same flags.
        data = {key: [list(entry) for entry in entries] for key, entries in data.items()}
        for key, now in data.items():
            before = self.recorded_files(previous, key) if key in previous else None
            if before is not None and _by_name(before) != _by_name(now):
                before, now = _by_name(before), _by_name(now)
                raise RunError(f"{self.path}: the {key.replace('_', ' ')} changed since this run started "
                               f"({_first_difference(before, now)}); resuming would go on with other data. Start a new "
                               f"run with a new --output_dir, or restore the data")
        if previous and program_of(previous) != program_of(identity):
            raise RunError(f"{self.path}: holds a {program_of(previous)} run; this is {program_of(identity)}'s: use "
                           f"a new --output_dir")
        missing = sorted(k for k in identity if k not in previous)
        if missing and any(k in previous for k in identity):
            raise RunError(f"{self.path}: holds a run whose run.json records no {', '.join(missing[:3])}"
                           f"{', ...' if len(missing) > 3 else ''} (made by another version of bert-packed): it cannot "
                           f"be told apart from another run; use a new --output_dir")
        changed = sorted(k for k in identity if k in previous and previous[k] != identity[k])
        if changed:
            differences = "; ".join(f"{k}: {_short(previous[k])} there, {_short(identity[k])} here" for k in changed[:3])
            raise RunError(f"{self.path}: holds another run ({differences}{'; ...' if len(changed) > 3 else ''}); use "
                           f"a new --output_dir, or the settings it was made with to resume it (a setting that no "
                           f"flag of this command gives was set by an earlier version of bert-packed)")
        self.write_info({**identity, **data, **{k: v for k, v in previous.items() if k == "finished"}})
        return previous

    def write_info(self, info: dict) -> None:
        files.write_text_atomically(self.file(RUN_INFO), json.dumps(info, indent=1) + "\n")

    def write_flags(self, text: str) -> None:
        files.write_text_atomically(self.file(FLAGS), text)

    # ---- the logs
    def read_log(self, name: str) -> list[dict]:
        """The records of a log ([] when there is none).

        Raises:
          RunError: a line is not a JSON object (naming the file and line).
        """
        return _records(self.file(name), self.read_text(name))

    def read_text(self, name: str) -> str:
        """The text of one of the run's files ("" when there is none)."""
        path = self.file(name)
        if not files.exists(path):
            return ""
        with files.open_file(path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def log_sizes(self) -> list[int]:
        """Bytes in each of LOGS (0 for one not written yet)."""
        return [files.size(self.file(name)) if files.exists(self.file(name)) else 0 for name in LOGS]

    def open_log(self, name: str):
        """The log `name`, open for appending lines."""
        return files.open_file(self.file(name), "a")

    def cut_logs(self, sizes: list[int], resumed: bool = True) -> None:
        """Cuts each of LOGS back to its size in `sizes` (what a checkpoint recorded), so that a
        resumed run logs again what it does again. A torn last line (a write cut short by a kill)
        is dropped with a warning; a damaged line in what is kept is named. Without a checkpoint
        (`resumed` false: sizes of 0), what an earlier start logged goes, as the run starts over.

        Raises:
          RunError: a log is shorter than recorded (edited or replaced), or a kept line is damaged.
        """
        for name, size in zip(LOGS, sizes):
            path = self.file(name)
            data = b""
            if files.exists(path):
                with files.open_file(path, "rb") as f:
                    data = f.read()
            if len(data) < size:
                raise RunError(f"{path}: holds {len(data)} bytes, but {size} when the checkpoint was saved: it was cut "
                               f"or replaced since; resume from a copy of the run, or use a new --output_dir")
            kept, dropped = data[:size].decode("utf-8", "replace"), data[size:].decode("utf-8", "replace")
            if name != MLLOG:
                _records(path, kept)
            if not dropped:
                continue
            lines = dropped.split("\n")
            if lines[-1]:
                logging.warning("%s: dropped its torn last line %d (%d characters)", path,
                                kept.count("\n") + len(lines), len(lines[-1]))
            if len(lines) > 1:
                redone = len(lines) - 1
                lines_text = f"{redone} line{'' if redone == 1 else 's'}"
                if resumed:
                    logging.info("%s: %s logged after the checkpoint %s redone", path, lines_text,
                                 "is" if redone == 1 else "are")
                else:
                    logging.info("%s: %s logged by an earlier start that saved no checkpoint %s removed: the run "
                                 "starts at step 0", path, lines_text, "is" if redone == 1 else "are")
            files.write_text_atomically(path, kept)

    def read_histogram(self, name: str, identity) -> list[int] | None:
        """The length histogram cached for the files of `identity` (path, bytes, head of each),
        None when there is none for them."""
        text = self.read_text(f"{name}_histogram.json")
        if not text:
            return None
        try:
            cached = json.loads(text)
        except json.JSONDecodeError:
            return None
        same = isinstance(cached, dict) and cached.get("files") == [list(entry) for entry in identity]
        return cached.get("histogram") if same else None

    def write_histogram(self, name: str, identity, histogram) -> None:
        """Caches the length histogram of the files of `identity` (counted for packing on the fly)."""
        files.write_text_atomically(self.file(f"{name}_histogram.json"), json.dumps(
            {"files": [list(entry) for entry in identity], "histogram": [int(c) for c in histogram]}) + "\n")

    def write_eval_results(self, record: dict) -> None:
        """eval_results.txt: an evaluation alone, `key = value` lines (as the reference writes)."""
        files.write_text_atomically(self.file(EVAL_RESULTS),
                                    "".join(f"{key} = {value}\n" for key, value in sorted(record.items())))

    def write_predictions(self, answers: dict, nbest: dict) -> None:
        """predictions.json ({question id: answer}) and nbest_predictions.json ({question id:
        [{"text", "probability", "start_logit", "end_logit"}, ...]}), as google-research's
        run_squad writes them (the official evaluation script reads the first)."""
        files.makedirs(self.path)
        files.write_text_atomically(self.file(NBEST_PREDICTIONS), json.dumps(nbest, indent=4) + "\n")
        files.write_text_atomically(self.file(PREDICTIONS), json.dumps(answers, indent=4) + "\n")

    def write_test_results(self, results) -> None:
        """test_results.tsv: each test example's class probabilities (a regression: its score), a
        line each in the test file's order, tab-separated, as google-research's run_classifier
        writes it."""
        files.makedirs(self.path)
        files.write_text_atomically(self.file(TEST_RESULTS), "".join(
            "\t".join(repr(float(value)) for value in row) + "\n" for row in results))


def _short(value) -> str:
    """A recorded value as a message quotes it: JSON, at most 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _by_name(entries: list) -> list:
    """[path, bytes, head] entries with the file's name for its path: data known by content."""
    return [[os.path.basename(str(entry[0])), *entry[1:]] for entry in entries]


def _an_identity(entry) -> bool:
    """Whether a run.json data entry is [path, bytes, head] (head a hash, or null where none was read)."""
    return (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and type(entry[1]) is int
            and isinstance(entry[2], (str, type(None))))


def _first_difference(before: list, now: list) -> str:
    """What differs first between two lists of [name, bytes, head], in words. Two directories may
    hold files of one name: the files of a name are paired in their order."""
    was, found = collections.Counter(f[0] for f in before), collections.Counter(f[0] for f in now)
    for name in [*was, *found]:
        if not found[name]:
            return f"{name} is no longer given"
        if not was[name]:
            return f"{name} was not given before"
        if found[name] != was[name]:
            return f"{name} is given {found[name]} time{'s' * (found[name] != 1)}, {was[name]} before"
    if collections.Counter(map(tuple, before)) == collections.Counter(map(tuple, now)):
        return "the order of the files"
    for name in was:
        for old, new in zip([f for f in before if f[0] == name], [f for f in now if f[0] == name]):
            if old[1] != new[1]:
                return f"{name} holds other content: {new[1]:,} bytes, {old[1]:,} before"
            if old != new:
                return f"{name} holds other content: the same {new[1]:,} bytes, but their hash differs"
    return "the order of the files"


def _records(path: str, text: str) -> list[dict]:
    """The JSON objects of a log's text, one a line; a torn last line (no newline) is left out."""
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            raise RunError(f"{path}: line {number} is not JSON; the log is damaged, not just torn at its end")
        records.append(record)
    return records


def program_of(info: dict) -> str:
    """The command a run.json's run is of, by what its identity records: run_squad's its
    doc_stride, run_classifier's its task, run_pretraining's neither."""
    return "run_squad" if "doc_stride" in info else "run_classifier" if "task_name" in info else "run_pretraining"
