"""An output directory that a command writes and the same command, run again, resumes or makes
again, never mixed with another kind of output.

Four kinds of output, each known by a file in its directory, each with its finished check and
its commit point (what it writes last):

  kind                 known by                       finished (commit point)
  unpacked data,       metadata.json                  metadata.json naming this run, every file it
  packed data                                         lists there (OutputJob.commit)
  a training run       run.json (or train_log.jsonl)  each checkpoint, which the same command
                                                      resumes; run.json's `finished` at the end
                                                      (bert_packed.training.loop)
  an exported model    model.safetensors, or a        config.json (Hugging Face), the checkpoint's
                       model.ckpt-N beside            .index (google-research), written last; the
                       bert_config.json; under way,   same export again writes it over whole
                       .export_under_way              (bert_packed.model.checkpoint)

Every one of them is held the same way first (claimed): the directory made, its lock held for the
whole run (locks.exclusive: local, or a claim on a bucket), a directory holding another kind of
output refused in one line naming it, and the temporary files a killed writer left removed.

Every data command that writes a dataset (create_pretraining_data, pack_pretraining_data, and
their Beam pipelines) then goes through one OutputJob, so that each rule below exists once:

- **Finished**: metadata.json names this run (its settings and inputs' paths: the run digest)
  and the inputs' content it was made from (the inputs digest), every file it lists is there,
  and no work is left: nothing to do, read only (a finished dataset on read-only storage is fine).
- **Claim**: one exclusive lock (locks.exclusive: local, or a claim on a bucket) for the whole run;
  a directory holding another kind of output, another run's data or another run's unfinished work
  is refused in one line naming what differs.
- **Leftovers**: temporary files are removed under the lock; an unfinished run whose inputs
  changed, that another version left, whose work is damaged or whose published files are gone or
  changed is started over (the claim says so first, so that a kill midway starts over again; then
  its outputs are removed, metadata.json first, so that nothing looks finished).
- **Work units**: each unit of work (an input read, a shard written) saves a summary when it is
  done, under a name the job keeps in its work directory; a resumed run redoes only the units
  without one. The single-machine executor (each_unit: threads) and Beam's read and write the
  same summaries.
- **Commit**: the inputs are checked unchanged since the claim, the claim is confirmed (on a
  bucket, no other host wrote meanwhile), metadata.json is written last, the work is removed.

The work directory is `output_dir/.work`; for an output on a remote filesystem written from this
machine, a local directory named after it (files.local_stand_in: appends and memory maps work
there), unless the work is to be shared: by a pipeline's workers, or by this machine's run and a
pipeline's, which then resume each other (`shared_work`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable

from bert_packed.console.progress import Progress
from bert_packed.errors import OutputDirectoryError, UserError
from bert_packed.inputs.dataset_info import (
    HISTOGRAM_FILE,
    METADATA_FILE,
    DatasetInfo,
    check_size,
    read_dataset_info,
    require_listed_files,
    write_dataset_info,
)
from bert_packed.inputs.file_identity import FileIdentity
from bert_packed.storage import files, locks
from bert_packed.storage.run_directory import RunDirectory

# The layout of the work directory; an unfinished run left by another layout starts over.
WORK_FORMAT = 4
_CLAIM = "run"  # the claim: a unit of its own, run.json
# The kinds of output (module docstring), as refusals name them.
UNPACKED_DATA, PACKED_DATA, TRAINING_RUN, EXPORTED_MODEL = ("unpacked data", "packed data", "a training run",
                                                            "an exported model")
# What an exported model is known by: a Hugging Face directory's weights, or google-research's
# checkpoint (model.ckpt-STEP.index, .data-*) beside its bert_config.json; while an export writes
# (one killed midway too: it may have removed the checkpoint it writes over), by its mark.
HUGGINGFACE_WEIGHTS = "model.safetensors"
GOOGLE_CONFIG, GOOGLE_CHECKPOINT = "bert_config.json", "model.ckpt-"
EXPORT_UNDER_WAY = ".export_under_way"


class WorkDamagedError(UserError, ValueError):
    """A file of an unfinished run's work is not what the run wrote; the claim says so, and the
    same command, run again, starts over."""


class InputsChangedError(UserError, RuntimeError):
    """An input file changed while its output was being made (nothing is published; the same
    command, run again, starts over on what the file holds now)."""


def digest(value) -> str:
    """The SHA-256 of a JSON value, keys sorted: what a run's identity is compared by."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class WorkUnits:
    """A job's work directory: each unit's summary (JSON, written atomically once the unit is
    done) and the unit's other work files. Plain and picklable: worker processes and Beam's
    workers get it, not the job.

    Attributes:
      directory: where the work is kept.
    """

    directory: str

    def file(self, name: str) -> str:
        """The path of the work file `name` (a bucket of rows, say)."""
        return os.path.join(self.directory, name)

    def done(self, unit: str) -> bool:
        return files.exists(self.file(unit + ".json"))

    def save(self, unit: str, summary: dict) -> dict:
        """Records `unit` as done, with its summary; returns the summary."""
        files.write_text_atomically(self.file(unit + ".json"), json.dumps(summary) + "\n")
        return summary

    def load(self, unit: str) -> dict:
        """The unit's summary.

        Raises:
          WorkDamagedError: it is not what save() wrote (edited, or its storage damaged it).
        """
        path = self.file(unit + ".json")
        try:
            return files.read_json_object(path)
        except ValueError as e:
            raise WorkDamagedError(f"{path}: damaged ({e})") from None

    def forget(self, unit: str) -> None:
        """Makes `unit` undone: the next run does it again."""
        if self.done(unit):
            files.remove(self.file(unit + ".json"))

    def start_over_next_time(self) -> None:
        """Makes the claim forget the inputs' content: the same command, run again, starts over."""
        self.save(_CLAIM, {**self.load(_CLAIM), "input_content": None})

    def input_changed(self, path: str, what: str) -> InputsChangedError:
        """The error for an input found changed during the run, once the claim says to start over
        on what the files hold now."""
        self.start_over_next_time()
        return InputsChangedError(f"{path}: changed while its output was being made ({what}); nothing published. "
                                  f"Run the same command again to use what it holds now")

    def summaries(self) -> list[dict]:
        """The summaries of the units done, in their names' order."""
        return [self.load(name.removesuffix(".json")) for name in sorted(files.listdir(self.directory))
                if name.endswith(".json") and name != _CLAIM + ".json"]


class OutputJob:
    """One run of a data command on its output directory (see the module's docstring).

    A command's run, top to bottom:

        job = OutputJob(output_dir, "pack_pretraining_data", PACKED_DATA, identity, sources,
                        outputs=("packed-",))
        done = job.finished()              # read only, no lock
        if done is not None:
            return done
        with job.writing() as done:        # locked, claimed, leftovers removed
            if done is not None:           # finished, but a kill left its work behind
                return done
            summaries = job.each_unit(read_input, units, num_workers, progress)
            ...
            return job.commit(info)        # metadata.json last

    Args:
      output_dir: the directory written.
      command: the command's name, recorded in the lock for whoever finds it held.
      kind: what it writes, UNPACKED_DATA or PACKED_DATA (refuse_other_output).
      identity: what makes two runs the same run (settings, the inputs' paths), JSON.
      inputs: the input files, whose content (identify(path)) the output is made from.
      outputs: the prefixes of the names of the files the command writes in `output_dir`.
      identify: an input's content, as a JSON value; by default its size and the hash of its
        first 64 KiB (cheap on a bucket, the identity data files have everywhere in this project:
        an edit past them that keeps the size goes unnoticed), or all of it hashed (create's text).
      shared_work: keep the work in `output_dir` even on a remote filesystem (a pipeline's
        workers on other machines write it, or this machine's run and a pipeline's resume each
        other).
    """

    def __init__(self, output_dir: str, command: str, kind: str, identity: dict, inputs: list[str],
                 outputs: tuple[str, ...], identify: Callable[[str], dict] | None = None, shared_work: bool = False):
        self.output_dir = output_dir
        self.command = command
        self.kind = kind
        self.identity = identity
        self.inputs = inputs
        self.outputs = outputs
        self.identify = identify or (lambda path: FileIdentity.of(path).content)
        work = os.path.join(output_dir, ".work")
        self.units = WorkUnits(work if shared_work or "://" not in work else files.local_stand_in(work))
        self.run_digest = digest(identity)
        self._input_content: list | None = None
        self._confirm: Callable[[], None] | None = None

    @property
    def input_content(self) -> list:
        """Each input's content as identify() gives it, read once a run (at the claim)."""
        if self._input_content is None:
            self._input_content = [self.identify(path) for path in self.inputs]
        return self._input_content

    def finished(self) -> dict | None:
        """The metadata of this very run, finished and clean in `output_dir`, else None. Reads
        only: no lock, nothing removed."""
        info = read_dataset_info(self.output_dir) if files.isdir(self.output_dir) else None
        if info is None or info.details.get("run_digest") != self.run_digest or files.exists(self.units.directory):
            return None
        names = files.listdir(self.output_dir)
        if any(files.is_temporary_name(name) for name in names) or \
                info.details.get("inputs_digest") != digest(self.input_content):
            return None
        return self._whole(info, names)

    def _whole(self, info: DatasetInfo, names: list[str]) -> dict:
        """The metadata of a finished run, once every file it lists is in `names` (a listing of
        the directory) at its recorded size: one request a file, no read.

        Raises:
          DatasetFilesError: naming a file gone, cut short or rewritten.
        """
        require_listed_files(self.output_dir, info, names)
        for entry in info.files + info.eval_files:
            check_size(os.path.join(self.output_dir, entry.name), entry)
        logging.info("%s: already made with these settings and inputs; nothing to do", self.output_dir)
        return info.to_dict()

    @contextlib.contextmanager
    def writing(self):
        """Holds `output_dir` for the block: locked, checked, leftovers removed, claimed.

        Yields:
          The metadata when the run turns out finished (its work, which a kill after the commit
          left, is removed), else None: the units not done are to be done.

        Raises:
          DirectoryLockedError: another process holds it.
          OutputDirectoryError: it holds another kind of output, or another run's.
        """
        with claimed(self.output_dir, self.command, self.kind) as confirm:
            self._input_content = None  # read anew under the lock
            self._confirm = confirm
            try:
                yield self._claim()
            finally:
                self._confirm = None

    def _claim(self) -> dict | None:
        info = read_dataset_info(self.output_dir)
        if info is not None:
            if info.details.get("run_digest") != self.run_digest:
                raise OutputDirectoryError(f"{self.output_dir}: already holds {self.kind} made with other "
                                           f"{_differing(info.details.get('run_identity'), self.identity)}; use a new "
                                           f"--output_dir or remove it")
            if info.details.get("inputs_digest") == digest(self.input_content):
                files.rmtree(self.units.directory)  # a kill after the commit left it
                return self._whole(info, files.listdir(self.output_dir))
            logging.warning("%s: the input files changed since its %s was made; making it again", self.output_dir,
                            self.kind)
            self._start_over()
        elif self.units.done(_CLAIM):
            try:
                previous = self.units.load(_CLAIM)
            except WorkDamagedError:
                previous = {"run_digest": self.run_digest, "damaged": True}
            if previous.get("run_digest", previous.get("digest")) != self.run_digest:  # "digest": the packer's, before
                raise OutputDirectoryError(f"{self.output_dir}: holds an unfinished {previous.get('command', 'run')} "
                                           f"run with other {_differing(previous.get('identity'), self.identity)}; "
                                           f"use a new --output_dir or remove it")
            why = ("its claim is damaged" if "damaged" in previous
                   else "another version of the command left it" if previous.get("work_format") != WORK_FORMAT
                   else "it was left to start over" if previous.get("input_content") is None
                   else "its input files changed since" if previous.get("input_content") != self.input_content
                   else self._work_damaged())
            if why:
                logging.warning("%s: the unfinished run cannot be resumed (%s); starting over", self.output_dir, why)
                self._start_over()
        elif any(name.startswith(self.outputs) for name in files.listdir(self.output_dir)):
            raise OutputDirectoryError(f"{self.output_dir}: already holds {self.kind}; use a new --output_dir or "
                                       f"remove it")
        self._write_claim(self.input_content)
        done = sum(1 for name in files.listdir(self.units.directory) if name.endswith(".json")) - 1  # less the claim
        if done:
            logging.info("%s: resuming the unfinished run: %d units of its work already done", self.output_dir, done)
        return None

    def _work_damaged(self) -> str | None:
        """What makes the work of an unfinished run unusable, if anything: a summary that does not
        read, or a published file a done unit recorded ("file", with its size and head) that is not
        in `output_dir` as written: removed, or replaced since (the output on a bucket and the work
        on this host can part ways)."""
        try:
            summaries = self.units.summaries()
        except WorkDamagedError as e:
            return str(e)
        for summary in summaries:
            if "file" not in summary:
                continue
            path = os.path.join(self.output_dir, summary["file"])
            now = FileIdentity.of(path).content if files.exists(path) else None
            if now is None or any(summary.get(key) != value for key, value in now.items()):
                return f"{summary['file']}, which it wrote, is gone or changed"
        return None

    def _write_claim(self, input_content: list | None) -> None:
        files.makedirs(self.units.directory)
        self.units.save(_CLAIM, {"command": self.command, "run_digest": self.run_digest, "work_format": WORK_FORMAT,
                                 "identity": self.identity, "input_content": input_content})

    def _start_over(self) -> None:
        """Removes the run's outputs (metadata.json first: nothing looks finished) and its work.
        The claim is first written with no inputs' content: a kill midway starts over again."""
        self._write_claim(None)
        for name in [METADATA_FILE, HISTOGRAM_FILE] + files.listdir(self.output_dir):
            if name in (METADATA_FILE, HISTOGRAM_FILE) or name.startswith(self.outputs):
                path = os.path.join(self.output_dir, name)
                if files.exists(path):
                    files.remove(path)
        for name in files.listdir(self.units.directory):
            if name != _CLAIM + ".json":
                files.remove(self.units.file(name))

    def remove(self, before: Callable[[], None] = lambda: None) -> None:
        """Removes the output directory whole, under its lock, after before() (what is made of the
        output, done under the same lock: no other run changes it meanwhile). The claim first says
        to start over, so that a kill midway leaves a run the same command makes again, not a
        half-removed dataset taken for another run's."""
        with locks.exclusive(os.path.join(self.output_dir, ".lock"), self.command):
            before()
            self._start_over()
        files.rmtree(self.output_dir)

    def each_unit(self, function: Callable[..., dict], units: list[tuple[str, tuple]], num_workers: int,
                  progress: Progress) -> list[dict]:
        """The single-machine executor: function(*args) for each (unit, args) not done yet, on
        `num_workers` threads (0: one per core); each saves its unit's summary (WorkUnits.save)
        when done. Returns every unit's summary, in the order given.

        Threads, not processes: the data commands' work is in compiled loops that release the GIL
        (numba's nogil), NumPy and file I/O.
        """
        todo = [(unit, args) for unit, args in units if not self.units.done(unit)]
        progress.done = len(units) - len(todo)
        in_parallel(function, [args for _, args in todo], num_workers, progress)
        return [self.units.load(unit) for unit, _ in units]

    def commit(self, info: DatasetInfo) -> dict:
        """Publishes the run: writes `info` (with the run's digests) as metadata.json, last, and
        removes the work; returns the metadata.

        Raises:
          InputsChangedError: an input changed since the claim.
          DirectoryLockedError: on a bucket, another process claimed the directory meanwhile.
        """
        claimed = self.input_content
        self._input_content = None
        for path, before, now in zip(self.inputs, claimed, self.input_content):
            if before != now:
                raise self.units.input_changed(path, "its size or content differ from the run's start")
        self._confirm()
        info = dataclasses.replace(info, details={**info.details, "run_identity": self.identity,
                                                  "run_digest": self.run_digest,
                                                  "inputs_digest": digest(self.input_content)})
        metadata = write_dataset_info(self.output_dir, info)
        files.rmtree(self.units.directory)
        return metadata


def _differing(before, now: dict) -> str:
    """Which parts of a run's identity differ, as words: "settings (dupe_factor, max_seq_length)",
    "sources": a setting by its own name, however deep in the identity."""
    if not isinstance(before, dict):
        return "settings or inputs"
    parts = []
    for key in sorted(before.keys() | now.keys()):
        old, new = before.get(key), now.get(key)
        if old != new:
            names = sorted(set(_leaves_differing(old, new)))
            parts.append(f"{key} ({', '.join(names)})" if names else key)
    return " and ".join(parts) or "settings or inputs"


def _leaves_differing(old, new):
    """The names of the innermost keys whose values differ between two dicts (nested ones too; a
    file's content, {"bytes", "head", ...}, is one value)."""
    if not (isinstance(old, dict) and isinstance(new, dict)) or "bytes" in old:
        return
    for name in old.keys() | new.keys():
        if old.get(name) != new.get(name):
            inner = list(_leaves_differing(old.get(name), new.get(name)))
            yield from inner or [name]


def in_parallel(function, jobs: list[tuple], num_workers: int, progress: Progress) -> None:
    """Runs function(*job) for every job on `num_workers` threads (0: one per core); the first
    error stops the run (the jobs not started are cancelled) and is raised."""
    num_workers = min(num_workers or os.cpu_count() or 1, max(len(jobs), 1))
    with concurrent.futures.ThreadPoolExecutor(num_workers) as pool:
        futures = [pool.submit(function, *job) for job in jobs]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
                progress.update(1)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    progress.close()


@contextlib.contextmanager
def claimed(output_dir: str, command: str, kind: str):
    """Holds `output_dir` for a run of a command that writes `kind` of output (module docstring):
    made, locked for the block, refused when it holds another kind, the temporary files a killed
    writer left removed.

    Args:
      output_dir: the directory written.
      command: the command's name, recorded in the lock for whoever finds it held.
      kind: UNPACKED_DATA, PACKED_DATA, TRAINING_RUN or EXPORTED_MODEL.

    Yields:
      locks.exclusive's confirm: on a bucket, raises DirectoryLockedError if another host
      claimed the directory meanwhile (call it before a commit).

    Raises:
      DirectoryLockedError: another process holds it.
      OutputDirectoryError: it holds another kind of output.
    """
    refuse_other_output(output_dir, kind)  # first without the lock: a refusal leaves the directory untouched
    files.makedirs(output_dir)
    with locks.exclusive(os.path.join(output_dir, ".lock"), command) as confirm:
        refuse_other_output(output_dir, kind)
        files.remove_leftovers(output_dir)
        yield confirm


def found_output(directory: str) -> str | None:
    """The kind of output `directory` holds (module docstring), by the file it is known by; None
    for none of them (an empty or missing directory, a user's own files)."""
    info = read_dataset_info(directory)
    if info is not None:
        return PACKED_DATA if info.packed else UNPACKED_DATA
    if RunDirectory(directory).holds_run():
        return TRAINING_RUN
    names = files.listdir(directory) if files.isdir(directory) else []
    if EXPORT_UNDER_WAY in names or HUGGINGFACE_WEIGHTS in names or \
            (GOOGLE_CONFIG in names and any(name.startswith(GOOGLE_CHECKPOINT) for name in names)):
        return EXPORTED_MODEL
    return None


def refuse_other_output(directory: str, kind: str) -> None:
    """Refuses `directory` when it holds output of another kind than `kind`.

    Args:
      directory: an output directory about to be written.
      kind: what the command writes: UNPACKED_DATA, PACKED_DATA, TRAINING_RUN or EXPORTED_MODEL.

    Raises:
      OutputDirectoryError: naming what the directory holds.
    """
    found = found_output(directory)
    if found is not None and found != kind:
        if files.exists(os.path.join(directory, EXPORT_UNDER_WAY)):
            found += " under way, or killed midway (the same export command finishes it)"
        raise OutputDirectoryError(f"{directory}: holds {found}; {kind} would be mixed into it. Use another "
                                   f"directory")
