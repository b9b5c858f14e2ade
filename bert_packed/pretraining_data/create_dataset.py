"""Text files -> unpacked pre-training TFRecords (MLPerf schema) and their length histogram.

Each input file is read and tokenized once, in the main process (the Rust tokenizer uses every
core). Random "next" segments come from the same file, as when MLPerf runs the reference script
per shard. Every (file i, dupe pass p) is then one work unit of the run's OutputJob, for the
worker pool: it draws from a NumPy Generator seeded with (seed, i, p), writes
`part-{i:05d}-{p:03d}.tfrecord` (its instances in random order) and, after it, saves its
summary (counts, histogram). So the output is the same whatever the number of workers, the work
spreads evenly over them, and an interrupted run resumes where it stopped.

With eval_fraction > 0, a seeded share of each file's documents is held out: they never reach
the training shards, and one more job per file writes them once as `eval-{i:05d}.tfrecord`.
A shard with no instance (a small file that holds nothing out, say) is not written: its unit's
summary alone marks it done.

Output directory:
  part-00000-000.tfrecord ...   unpacked training records
  eval-00000.tfrecord ...       held-out documents (with eval_fraction > 0)
  histogram.json                merged length histogram of the training records (docs/data_formats.md)
  metadata.json                 settings, sources, totals, statistics
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from bert_packed.console.progress import Progress
from bert_packed.errors import SettingsError, UserError, raise_if_retryable
from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import HISTOGRAM_FILE, DataFile, DatasetInfo
from bert_packed.inputs.file_identity import FileIdentity, file_sha256
from bert_packed.inputs.histogram_file import save_histogram
from bert_packed.packing.histogram import histogram_from_lengths, merge_histograms
from bert_packed.pretraining_data.corpus import (
    INPUT_FORMATS,
    CorpusError,
    detect_corpus_format,
)
from bert_packed.pretraining_data.documents import tokenize_file, unflatten
from bert_packed.pretraining_data.instances import MaskingConfig, create_instances, instance_features
from bert_packed.pretraining_data.tokenization import Tokenizer
from bert_packed.records import TFRecordWriter, read_record_batches
from bert_packed.storage import files
from bert_packed.storage.output_job import UNPACKED_DATA, OutputJob, WorkUnits


class WorkerLostError(UserError, RuntimeError):
    """A worker process of the pool was killed (the kernel's out-of-memory killer, say), or a worker
    process, as it started, ran a script that makes a dataset outside `if __name__ == "__main__":`."""


@dataclasses.dataclass(frozen=True)
class DatasetSettings:
    """Everything that decides the output; a resumed run must use the same."""

    vocab_file: str
    do_lower_case: bool
    config: MaskingConfig
    dupe_factor: int
    seed: int
    empty_documents: str = "warn"  # or "error"
    eval_fraction: float = 0.0  # share of each file's documents held out for evaluation
    input_format: str = "auto"  # or one of corpus.INPUT_FORMATS; resolved from the first input file
    text_field: str = "text"  # the text of a JSON lines object

    @functools.cached_property
    def vocab_identity(self) -> dict:
        """A vocabulary is its content, not its name: hashed once, here (workers get it with the settings)."""
        return _source_identity(self.vocab_file)

    def to_dict(self) -> dict:
        result = dataclasses.asdict(self)
        if self.input_format != "jsonl":
            del result["text_field"]  # read in no other format: another one changes nothing
        result["vocab_file"] = os.path.basename(self.vocab_file)
        result["vocab_identity"] = self.vocab_identity
        return result


EVAL_PASS = -1  # the job that writes a file's held-out documents, once, with fresh masks


def shard_name(file_index: int, dupe_pass: int) -> str:
    if dupe_pass == EVAL_PASS:
        return f"eval-{file_index:05d}"
    return f"part-{file_index:05d}-{dupe_pass:03d}"


def _passes(settings: DatasetSettings) -> list[int]:
    return list(range(settings.dupe_factor)) + ([EVAL_PASS] if settings.eval_fraction > 0 else [])


def create_pretraining_dataset(input_files: list[str], output_dir: str, settings: DatasetSettings,
                               num_workers: int = 0, make_shards: Callable | None = None,
                               command: str = "create_pretraining_data") -> dict:
    """Writes the unpacked dataset; returns the metadata (also written to metadata.json).

    Args:
      input_files: text files, in a fixed order (their position seeds their jobs).
      output_dir: created if missing; may hold a previous run with the same settings and inputs.
      settings: see DatasetSettings.
      num_workers: processes (0: one per core).
      make_shards: what runs the jobs, make_shards(jobs, units, output_dir, settings): each job
        (a ShardJob) is one input file's unwritten shards, for make_file_shards, which saves
        each shard's summary in `units` (WorkUnits). None: this machine's processes;
        bert_packed.beam gives a Beam pipeline's.
      command: the command run, named in the output's lock for whoever finds it held.

    Raises:
      CorpusError / VocabularyError: bad input, naming the file.
      OutputDirectoryError: the directory holds data made with other settings or inputs.
      DirectoryLockedError: another process is writing `output_dir` now.
      InputsChangedError: an input file changed during the run.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # multiprocessing's own test of it
        raise WorkerLostError(f"{command}: called in a worker process as it started: each worker imports again the "
                              f"script that started it, so a script of your own calls {command} under "
                              f"`if __name__ == \"__main__\":`")
    if not input_files:
        raise CorpusError("no input files")
    tokenizer = Tokenizer(settings.vocab_file, settings.do_lower_case)  # fails early on a bad vocabulary
    settings = resolve_input_format(input_files, settings)
    job = _job(input_files, output_dir, settings, command)
    done = job.finished()
    if done is not None:
        return done
    with job.writing() as done:
        if done is not None:
            return done
        jobs = _unwritten_shards(job, settings)
        if make_shards is None:
            _make_shards_here(jobs, job.units, output_dir, settings, tokenizer, num_workers, input_files)
        else:
            make_shards(jobs, job.units, output_dir, settings)
        return job.commit(_description(job, settings, tokenizer.vocab_size))


def _job(input_files: list[str], output_dir: str, settings: DatasetSettings,
         command: str = "create_pretraining_data") -> OutputJob:
    """The OutputJob of a run (its settings' input format resolved).

    A run is its settings (the vocabulary by its content) and its inputs by name, not by folder: a
    moved checkout finds its finished shards. Each input's content is all of it hashed (it is all
    read anyway): an edit that keeps the size is noticed wherever it is. The work (a summary a
    shard) is beside the output wherever that is: a run of this machine's and one of Beam's resume
    each other.
    """
    sources = [files.absolute(path) for path in input_files]
    identity = {"settings": {key: value for key, value in settings.to_dict().items() if key != "vocab_file"},
                "sources": [os.path.basename(path) for path in sources]}
    return OutputJob(output_dir, command, UNPACKED_DATA, identity, sources,
                     outputs=("part-", "eval-"), identify=_source_identity, shared_work=True)


def resolve_input_format(input_files: list[str], settings: DatasetSettings) -> DatasetSettings:
    """The settings with "auto" replaced by the format detected in every input file
    (detect_corpus_format), said in one line: the corpus is read in that format."""
    if settings.input_format != "auto":
        return settings
    input_format, reason = detect_corpus_format(input_files)
    others = len(input_files) - 1
    logging.info("input format: %s (--input_format=%s), detected in %s%s: %s", INPUT_FORMATS[input_format],
                 input_format, input_files[0], {0: "", 1: " and its other file"}.get(others, f" and its {others} other files"),
                 reason)
    return dataclasses.replace(settings, input_format=input_format)


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """One input file's shards still to write.

    Attributes:
      file_index: the file's position among the inputs (it seeds the file's draws).
      source: the file's absolute path.
      passes: the dupe passes (EVAL_PASS: the held-out documents) to write.
    """

    file_index: int
    source: str
    passes: tuple[int, ...]


def _unwritten_shards(job: OutputJob, settings: DatasetSettings) -> list[ShardJob]:
    """The jobs of the shards not yet written (a resumed run redoes only those)."""
    jobs = []
    for i, source in enumerate(job.inputs):
        passes = tuple(p for p in _passes(settings) if not job.units.done(shard_name(i, p)))
        if passes:
            jobs.append(ShardJob(i, source, passes))
    return jobs


def make_file_shards(job: ShardJob, units: WorkUnits, output_dir: str, settings: DatasetSettings) -> int:
    """Reads and tokenizes one input file and writes its unwritten shards, one pass after another,
    each as the single-machine command writes it; returns the instances written."""
    documents, held_out, empty = tokenize_file(job.source, job.file_index, _worker_tokenizer(settings), settings)
    return sum(_run_pass(job.file_index, p, job.source, held_out if p == EVAL_PASS else documents, empty, units,
                         output_dir, settings) for p in job.passes)


def _make_shards_here(jobs: list[ShardJob], units: WorkUnits, output_dir: str, settings: DatasetSettings,
                      tokenizer: Tokenizer, num_workers: int, input_files: list[str]) -> None:
    """Runs the jobs on this machine: each file tokenized in this process (the Rust tokenizer uses
    every core), its passes on a pool of `num_workers` processes (0: one per core). A file is read
    by its path as given (`input_files`), which its warnings name."""
    todo = sum(len(job.passes) for job in jobs)
    done = len(units.summaries())  # by an earlier run
    progress = Progress("create_pretraining_data", total=done + todo, unit="shards")
    progress.done = done
    num_workers = num_workers or os.cpu_count() or 1
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if num_workers > 1 and script is not None and getattr(sys.modules["__main__"], "__spec__", None) is None \
            and not files.isfile(script):
        # A spawned worker runs the script that started it again: one read from stdin (`python -`) it cannot.
        logging.warning("%s: not a file, which worker processes could start from (a script read from stdin?): "
                        "the shards are made in this process", script)
        num_workers = 1
    instances = 0
    # Fresh interpreters for the workers: no inherited TensorFlow or tokenizer thread pools.
    pool = (concurrent.futures.ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context("spawn"),
                                                   initializer=_start_worker, initargs=(os.getpid(),))
            if num_workers > 1 else None)
    in_flight: set = set()
    try:
        for job in jobs:
            documents, held_out, empty = tokenize_file(input_files[job.file_index], job.file_index, tokenizer,
                                                        settings)
            for p in job.passes:
                args = (job.file_index, p, job.source, held_out if p == EVAL_PASS else documents, empty, units,
                        output_dir, settings)
                if pool is None:
                    instances += _run_pass(*args)
                    progress.update(1, f", {instances:,} instances")
                    continue
                with _signals_held():
                    in_flight.add(pool.submit(_run_pass, *args))
                while len(in_flight) > 2 * num_workers:  # bounds the tokenized files held in memory
                    finished, in_flight = concurrent.futures.wait(
                        in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
                    for future in finished:
                        instances += future.result()
                        progress.update(1, f", {instances:,} instances")
        for future in concurrent.futures.as_completed(in_flight):
            instances += future.result()
            progress.update(1, f", {instances:,} instances")
    except concurrent.futures.BrokenExecutor:
        raise WorkerLostError("a worker process ended before its work was done: killed (out of memory, or by a "
                              "signal), or, from a script of your own, one that does not call this under `if __name__ "
                              "== \"__main__\":` (each worker imports it again). The shards written are kept; run the "
                              "same command again (fewer --num_workers use less memory)") from None
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    progress.close()


_HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@contextlib.contextmanager
def _signals_held():
    """Holds SIGTERM and SIGINT back for the block, then lets them through: the pool's first
    submit starts its workers and its manager thread, and a signal handled in the middle would
    leave a thread that can be neither started nor joined, and the workers running."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_SIGNALS)


def _start_worker(parent: int) -> None:
    """A worker leaves Ctrl-C to its parent (one message, not one traceback a worker) and exits
    when the parent is gone (killed with -9, say) instead of working on for nobody."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_SIGNALS)  # held by the parent as it started the worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def exit_when_orphaned():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=exit_when_orphaned, daemon=True).start()


def _source_identity(path: str) -> dict:
    """The size and hashes of an input file (text, or the vocabulary): all of it is hashed, as
    all of it is read anyway, so an edit that keeps the size is noticed wherever it is."""
    try:
        if not files.isfile(path):  # a device (/dev/zero) never ends: the reader refuses it
            return FileIdentity.of(path).content
        return {**FileIdentity.of(path).content, "sha256": file_sha256(path)}
    except OSError as e:  # as reading it would say (a symlink loop, say)
        raise_if_retryable(e)
        raise CorpusError(f"{path}: cannot read: {e.strerror or e}") from None


def _run_pass(file_index: int, dupe_pass: int, source: str, documents, empty: list[str], units: WorkUnits,
              output_dir: str, settings: DatasetSettings) -> int:
    """One dupe pass (or the eval pass) over one file's documents -> one shard and its unit's
    summary; returns its instances.

    Args:
      source: the input file's path.
    """
    config = settings.config
    sentence_lengths = documents[1]
    documents = unflatten(*documents)
    tokenizer = _worker_tokenizer(settings)
    continuation = None
    if config.do_whole_word_mask:
        with files.open_file(settings.vocab_file) as f:
            continuation = np.array([line.startswith("##") for line in f])
    rng = np.random.default_rng([settings.seed, file_index, dupe_pass if dupe_pass != EVAL_PASS else 2**31 - 2])
    instances = create_instances(documents, config, tokenizer.vocab_size,
                                 (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id), rng, continuation)
    shapes = Shapes(config.max_seq_length, config.max_predictions_per_seq)
    name = shard_name(file_index, dupe_pass)
    written = {}
    if instances:  # no empty shard: every reader refuses an empty file, the dataset's own glob included
        path = os.path.join(output_dir, name + ".tfrecord")
        with TFRecordWriter(path) as writer:
            for start in range(0, len(instances), 4096):  # padded int64 features a chunk at a time: bounded memory
                writer.write_examples(instance_features(instances[start:start + 4096], shapes))
        written = {"file": name + ".tfrecord", **FileIdentity.of(path).content}
    summary = {
        **written,
        "source": source,
        "file_index": file_index,
        "dupe_pass": dupe_pass,
        "num_documents": len(documents),
        "num_sentences": len(sentence_lengths),
        "num_document_tokens": int(sentence_lengths.sum()),
        # Tokens of sentences longer than an instance's pair holds, beyond what it holds.
        "num_unused_tokens": int(np.maximum(sentence_lengths - (config.max_seq_length - 3), 0).sum()),
        "empty_documents": empty,
        "num_instances": len(instances),
        "num_predictions": int(sum(len(i.masked_lm_positions) for i in instances)),
        "num_random_next": int(sum(i.is_random_next for i in instances)),
        "histogram": histogram_from_lengths([len(i.input_ids) for i in instances], config.max_seq_length).tolist(),
    }
    units.save(name, summary)
    return len(instances)


_TOKENIZERS: dict = {}


def _worker_tokenizer(settings: DatasetSettings) -> Tokenizer:
    """One Tokenizer per worker process (its special ids and vocabulary size)."""
    key = (settings.vocab_file, settings.do_lower_case)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = Tokenizer(*key)
    return _TOKENIZERS[key]


def _description(job: OutputJob, settings: DatasetSettings, vocab_size: int) -> DatasetInfo:
    """The dataset's metadata.json, from its shards' summaries (the histogram.json it names is
    written here); `vocab_size`, the vocabulary's, is what a run's BERT config is checked against."""
    sources, output_dir = job.inputs, job.output_dir
    shards, evals = [], []
    for i in range(len(sources)):
        for p in _passes(settings):
            (evals if p == EVAL_PASS else shards).append(job.units.load(shard_name(i, p)))
    if not sum(s["num_instances"] for s in shards):
        raise CorpusError(f"no training instances from {len(sources)} input files"
                          + (f": --eval_fraction={settings.eval_fraction} held out every document"
                             if settings.eval_fraction and any(s["num_instances"] for s in evals) else ""))
    histogram = merge_histograms(*[s["histogram"] for s in shards])
    histogram_path = os.path.join(output_dir, HISTOGRAM_FILE)
    save_histogram(histogram_path, histogram)
    lengths = np.arange(1, len(histogram) + 1)
    num_instances = int(histogram.sum())
    first_pass = [s for s in shards if s["dupe_pass"] == 0]
    config = settings.config

    def entries(summaries):
        return tuple(DataFile.of(os.path.join(output_dir, shard_name(s["file_index"], s["dupe_pass"]) + ".tfrecord"),
                                 records=s["num_instances"], sequences=s["num_instances"])
                     for s in summaries if s["num_instances"])

    if settings.eval_fraction and not any(s["num_instances"] for s in evals):
        logging.warning("--eval_fraction=%s held out no document of %d input files: no eval-*.tfrecord written",
                        settings.eval_fraction, len(sources))

    for line in _misread(settings, len(sources), first_pass, sum(s["num_random_next"] for s in shards) / num_instances,
                         num_instances):
        logging.warning("%s", line)
    return DatasetInfo(
        packed=False, shapes=Shapes(config.max_seq_length, config.max_predictions_per_seq),
        num_sequences=num_instances, num_records=num_instances, files=entries(shards), eval_files=entries(evals),
        sources=tuple(sources), histogram_sha256=file_sha256(histogram_path),
        details={
            "settings": settings.to_dict(),
            "vocab_size": vocab_size,
            "num_documents": sum(s["num_documents"] for s in first_pass),
            "num_empty_documents": sum(len(s["empty_documents"]) for s in first_pass),
            "num_sentences": sum(s["num_sentences"] for s in first_pass),
            "num_tokens": int(histogram @ lengths),
            "padding_fraction": 1.0 - float(histogram @ lengths) / (num_instances * len(histogram)),
            "full_length_fraction": float(histogram[-1]) / num_instances,
            "predictions_per_instance": sum(s["num_predictions"] for s in shards) / num_instances,
            "random_next_fraction": sum(s["num_random_next"] for s in shards) / num_instances,
            "num_eval_documents": sum(s["num_documents"] for s in evals),
            "num_eval_instances": sum(s["num_instances"] for s in evals),
            # The text's content, whatever its path: another dataset made from it is not an eval set.
            "source_sha256": [content.get("sha256") for content in job.input_content],
        })


_FEW_SENTENCES_HINT = {
    "sentences": ": a blank line ends a document; put blank lines between documents only",
    "documents": ": if a document's sentences are on lines of their own, give one sentence a line with blank lines "
                 "between documents (--input_format=sentences)",
}


def _misread(settings: DatasetSettings, num_files: int, first_pass: list[dict], random_next: float,
             num_instances: int) -> list[str]:
    """Warnings, one line each naming the likely format, when the corpus's statistics say it was
    read in the wrong one: most tokens unused, one document a file, NSP pairs mostly random."""
    documents = sum(s["num_documents"] for s in first_pass)
    sentences = sum(s["num_sentences"] for s in first_pass)
    tokens = sum(s["num_document_tokens"] for s in first_pass)
    unused = sum(s["num_unused_tokens"] for s in first_pass)
    read_as = f"read as {INPUT_FORMATS[settings.input_format]} (--input_format={settings.input_format})"
    lines = []
    if tokens and unused > 0.1 * tokens:
        lines.append(f"{unused / tokens:.0%} of the corpus's tokens go unused: they are in sentences longer than an "
                     f"instance (L={settings.config.max_seq_length}) with no sentence boundary to split them at, "
                     f"{read_as}; one sentence a line with blank lines between documents is --input_format=sentences")
    if settings.input_format == "sentences" and documents <= num_files and sentences >= 10 * max(documents, 1):
        lines.append(f"{documents:,} document{'' if documents == 1 else 's'} of {sentences / max(documents, 1):,.0f} "
                     f"sentences from {num_files:,} input file{'' if num_files == 1 else 's'}, {read_as}, where a blank "
                     f"line ends a document: if each line is a document, give --input_format=documents")
    # Far from 0.5 by more than chance explains (three standard deviations of a fair draw).
    if documents and abs(random_next - 0.5) > max(0.15, 1.5 / math.sqrt(max(num_instances, 1))):
        lines.append(f"{random_next:.0%} of the next-sentence pairs take a random next segment, not about 50%: "
                     f"documents hold {sentences / documents:.1f} sentences on average, {read_as}"
                     + (_FEW_SENTENCES_HINT.get(settings.input_format, "") if sentences < 3 * documents else ""))
    return lines


def create_pretraining_files(input_files: list[str], output_files: list[str], settings: DatasetSettings,
                             num_workers: int = 0) -> dict:
    """The reference's output: the training instances in plain TFRecord files, no dataset directory.

    The job runs as create_pretraining_dataset in `<first output>.parts/` (so it resumes the same
    way), then its records are dealt round-robin into `output_files`, each written atomically, and
    the parts are removed.

    Returns:
      The metadata of the instances (not written anywhere: many such commands may share a folder).

    Raises:
      SettingsError: an output file is a directory (before any work).
    """
    for path in output_files:
        if files.isdir(path):
            raise SettingsError(f"--output_file={path}: a directory; give a file's path (a dataset directory is "
                                f"--output_dir)")
    work = output_files[0] + ".parts"
    metadata = create_pretraining_dataset(input_files, work, settings, num_workers)

    def deal() -> None:
        for path in output_files:  # what a dealing killed midway left
            files.remove_leftovers(os.path.dirname(path) or ".", of=os.path.basename(path))
        with contextlib.ExitStack() as stack:
            writers = [stack.enter_context(TFRecordWriter(path)) for path in output_files]
            dealt = 0
            for entry in metadata["files"]:
                for _, data, starts, lengths in read_record_batches(os.path.join(work, entry["name"])):
                    records = [data[start:start + length] for start, length in zip(starts.tolist(), lengths.tolist())]
                    for index, writer in enumerate(writers):
                        writer.write_all(records[(index - dealt) % len(writers)::len(writers)])
                    dealt += len(records)

    _job(input_files, work, resolve_input_format(input_files, settings)).remove(before=deal)
    return {**metadata, "files": list(output_files)}
