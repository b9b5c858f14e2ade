"""Unpacked TFRecords -> packed TFRecords + metadata.json, losslessly, in bounded memory.

Three passes, each resumable, each spread over threads (the work is in compiled loops that
release the GIL, NumPy and file I/O):
1. Read every input file (records parsed and checked): its histogram and the checksum of its
   sequences go to `.work/input-NNNNN.json`.
2. Plan the packing on the merged histogram. Read the inputs again, give every sequence its pack
   and position (packer.SlotTable and keyed permutations: no per-sequence table in memory) and
   append it, as a compact row, to the bucket file of its pack (`.work/bucket-NNNNN.bin`). Packs
   are numbered in random output order and buckets are ranges of that order, sized to
   `bucket_bytes`. Each file's checksum must match its first reading.
3. For each bucket: load it, assemble its packs, decode them back and checksum the sequences,
   and write `packed-NNNNN-of-NNNNN.tfrecord`.

Reading the inputs twice costs less than writing every row to disk and reading it back: a row
is larger than its TFRecord, and disk writes are the slowest part of the job.

Peak memory is one bucket (default 256 MB of rows, memory-mapped) per worker in pass 3 and one
chunk (32,768 rows, ~120 MB at L=512 with its sorted copy) per worker in pass 2, whatever the
input size. The run succeeds only if
the sequences out (count and order-independent checksum, decoded from the packs written) equal
the sequences in; then metadata.json is written and .work removed.

`.work` is in the output directory, or, for one on a remote filesystem (gs://: no appends, no
memory maps), in a local directory named after it (_work_directory): the shards are written to
the bucket under a temporary name then renamed, metadata.json last."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from bert_packed import files
from bert_packed.dataset_info import (
    METADATA_FILE,
    DataFile,
    DatasetFilesError,
    DatasetInfo,
    FileIdentity,
    file_sha256,
    metadata_path,
    read_dataset_info,
    refuse_other_output,
    require_listed_files,
    write_dataset_info,
)
from bert_packed.errors import InternalError, OutputDirectoryError, SettingsError, UserError
from bert_packed.features import Shapes
from bert_packed.files import write_text_atomically
from bert_packed.packing import packer
from bert_packed.packing.histogram import HISTOGRAM_FILE, histogram_from_lengths, merge_histograms, save_histogram
from bert_packed.packing.pack_settings import PackSettings
from bert_packed.packing.plan import plan
from bert_packed.progress import Progress
from bert_packed.records import TFRecordWriter, read_packed, read_unpacked


class PackingError(InternalError):
    """The packed output does not hold exactly the input sequences (a bug; nothing is published)."""


class InputsChangedError(UserError, RuntimeError):
    """An input file changed while it was being packed (nothing is published; the rerun reads it anew)."""


class VerifyError(UserError, ValueError):
    """Packed data read back is not what its metadata.json says (tampered, cut short, incomplete)."""


def pack_pretraining_dataset(input_files: list[str], output_dir: str, settings: PackSettings,
                             num_workers: int = 0, passes=None) -> dict:
    """Packs the sequences of `input_files` into `output_dir`; returns the metadata.

    Args:
      input_files: unpacked TFRecord files, in a fixed order.
      output_dir: created if missing; may hold an unfinished run with the same settings and inputs.
      settings: see PackSettings.
      num_workers: threads of the default passes (0: one per core).
      passes: what runs the three passes: LocalPasses(num_workers), this machine's, by default;
        bert_packed.beam gives a Beam pipeline's. The checks before them, the audit after them
        and the commit (metadata.json, last) are the same whatever runs them.

    Raises:
      CorruptRecordError / RecordError: bad input, naming file and record.
      OutputDirectoryError: `output_dir` holds another run.
      DirectoryLockedError: another packer is writing `output_dir` now.
      PackingError: the output would not hold exactly the input sequences.
    """
    passes = passes or LocalPasses(num_workers)
    work = passes.work_directory(output_dir)
    done = _already_packed(input_files, output_dir, work, settings)
    if done is not None:  # read only, without the lock: a finished dataset on read-only storage is fine
        return done
    files.makedirs(output_dir)
    with files.exclusive(os.path.join(output_dir, ".lock"), "pack_pretraining_data") as confirm:
        refuse_other_output(output_dir, "packed data")
        files.remove_leftovers(output_dir)
        return _pack(input_files, output_dir, work, settings, passes, confirm)


def _work_directory(output_dir: str) -> str:
    """Where the packer keeps its passes' work: output_dir/.work, or, for an output_dir on a remote
    filesystem (which cannot append to a file or map one into memory), a local directory named
    after it, so that the same command on this machine resumes it."""
    work = os.path.join(output_dir, ".work")
    return work if "://" not in work else files.local_stand_in(work)


def _already_packed(input_files: list[str], output_dir: str, work: str, settings: PackSettings) -> dict | None:
    """The metadata of this very run, finished and clean in `output_dir` (nothing to do), else None."""
    info = read_dataset_info(output_dir) if files.isdir(output_dir) else None
    names = files.listdir(output_dir) if info is not None else []
    if info is None or any(".tmp-" in name for name in names) or files.exists(work):
        return None
    sources = [files.absolute(path) for path in input_files]
    same = info.details.get("run_digest") == _digest({"settings": settings.to_dict(), "sources": sources}) and \
        info.details.get("inputs_digest") == _digest([FileIdentity.of(path).content for path in sources])
    if not same:
        return None
    require_listed_files(output_dir, info, names, HISTOGRAM_FILE)
    logging.info("%s: already packed with these settings and inputs; nothing to do", output_dir)
    return info.to_dict()


def _described_inputs(sources: list[str], shapes: Shapes) -> dict[str, DataFile]:
    """The inputs' entries in their datasets' metadata.json, by path, once checked against it:
    unpacked records of the packer's L and P, each a file the description lists, of its recorded
    size and beginning (DatasetInfo.select), either all training shards or all held-out files.
    Inputs without a metadata.json (the reference's own files) have no entry.

    Raises:
      DatasetFilesError / SettingsError: naming the file or metadata.json and what differs.
    """
    groups: dict[str, list[str]] = {}
    for path in sources:
        groups.setdefault(os.path.dirname(path), []).append(path)
    entries = {}
    held_out = {}  # whether each described input is a held-out file (eval-*), by path
    for directory, paths in groups.items():
        info = read_dataset_info(directory)
        if info is None:
            continue
        if info.packed:
            raise DatasetFilesError(f"--input_files: {metadata_path(directory)} describes packed data; the packer "
                                    f"reads unpacked records (create_pretraining_data's)")
        differing = info.differing_lengths(shapes)
        if differing:
            name = differing[0]
            raise SettingsError(f"--input_files: {metadata_path(directory)} says {name}={getattr(info.shapes, name)}, "
                                f"but --{name}={getattr(shapes, name)}")
        entries.update(zip(paths, info.select(directory, paths, "--input_files", training=False)))
        held_out_names = {f.name for f in info.eval_files}
        held_out.update((path, os.path.basename(path) in held_out_names) for path in paths)
    if len(set(held_out.values())) > 1:
        raise DatasetFilesError(f"--input_files: {next(p for p, h in held_out.items() if h)} is a held-out file and "
                                f"{next(p for p, h in held_out.items() if not h)} a training shard: their packs would "
                                f"be neither training nor eval data (MLPerf never trains on the eval set); pack each "
                                f"set on its own")
    return entries


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _pack(input_files: list[str], output_dir: str, work: str, settings: PackSettings, passes,
          confirm: Callable[[], None]) -> dict:
    sources = [files.absolute(path) for path in input_files]
    identity = {"settings": settings.to_dict(), "sources": sources}
    # A run is its settings and inputs' paths (another is refused) and their content (when that
    # changed, the run is done again): each input's size and the hash of its beginning, cheap.
    digest, inputs_digest = _digest(identity), _digest([FileIdentity.of(path).content for path in sources])
    finished = _finished_run(output_dir, work, digest, inputs_digest)
    if finished is not None:
        files.rmtree(work)  # a kill between metadata.json and the clean-up left it
        return finished
    described = _described_inputs(sources, settings.shapes)
    files.makedirs(work)
    _claim(output_dir, work, identity, digest, inputs_digest)
    summaries, packing_plan, shards, seconds = passes(sources, [described.get(path) for path in sources], output_dir,
                                                      work, settings)
    checksum_in = audit_packs(summaries, shards)
    histogram_path = os.path.join(output_dir, HISTOGRAM_FILE)
    save_histogram(histogram_path, merge_histograms(*[s["histogram"] for s in summaries]))
    info = _description(settings, packing_plan, shards, sources, checksum_in, seconds, digest, inputs_digest,
                        file_sha256(histogram_path))
    confirm()  # on a bucket, no other host's run wrote here meanwhile
    metadata = write_dataset_info(output_dir, info)
    files.rmtree(work)
    return metadata


class LocalPasses:
    """The three passes on this machine: files and shards on `num_workers` threads (0: one per
    core), the work (bucket files, appended to and memory-mapped) on its disk."""

    def __init__(self, num_workers: int = 0):
        self.num_workers = num_workers

    def work_directory(self, output_dir: str) -> str:
        return _work_directory(output_dir)

    def __call__(self, sources: list[str], expected: list, output_dir: str, work: str, settings: PackSettings):
        """Runs the passes; returns (input summaries, plan, shard summaries, seconds per pass).

        Args:
          expected: each input's entry in its dataset's metadata.json (None where none).
        """
        shapes = settings.shapes
        seconds = {}
        start = time.perf_counter()
        summaries = _read_inputs(sources, work, shapes.unpacked(), self.num_workers, expected)
        seconds["read"] = time.perf_counter() - start
        start = time.perf_counter()
        histogram = merge_histograms(*[s["histogram"] for s in summaries])
        packing_plan = plan(histogram, shapes.max_seq_length, settings.algorithm, shapes.max_sequences_per_pack)
        max_token_id = max(s["max_token_id"] for s in summaries)
        num_buckets = bucket_count(settings, histogram, max_token_id, packing_plan.num_packs)
        if not files.exists(os.path.join(work, "buckets.json")):
            _distribute(summaries, histogram, work, shapes.unpacked(), packing_plan, num_buckets, max_token_id,
                        settings.seed, self.num_workers)
        seconds["plan_and_assign"] = time.perf_counter() - start
        start = time.perf_counter()
        shards = _write_packs(output_dir, work, settings, packing_plan.num_packs, num_buckets, max_token_id,
                              self.num_workers)
        seconds["write"] = time.perf_counter() - start
        return summaries, packing_plan, shards, seconds


def bucket_count(settings: PackSettings, histogram: np.ndarray, max_token_id: int, num_packs: int) -> int:
    """Output shards: --num_shards at least, more when a bucket of rows would exceed bucket_bytes,
    and never more than there are packs."""
    row_bytes = packer.row_dtype(settings.shapes.unpacked(), max_token_id).itemsize
    return min(max(settings.num_shards, math.ceil(int(histogram.sum()) * row_bytes / settings.bucket_bytes)), num_packs)


def audit_packs(summaries: list[dict], shards: list[dict]) -> int:
    """Checks that the packs written hold every input sequence exactly once (the MLPerf rule): as
    many sequences out as in, the same content (checksum of the sequences decoded from the packs
    written) and the same provenance (checksum of each sequence's input file and record).

    Returns:
      The input sequences' checksum.

    Raises:
      PackingError: what differs (nothing is published).
    """
    found = {}
    for side, parts in (("input", summaries), ("packed output", shards)):
        found[side] = (sum(int(np.sum(s["histogram"])) for s in parts) if side == "input"
                       else sum(s["num_sequences"] for s in parts),
                       packer.combine_checksums(*[int(s["checksum"], 16) for s in parts]),
                       packer.combine_checksums(*[int(s["provenance"], 16) for s in parts]))
    if found["input"] != found["packed output"]:
        words = {side: f"{n} sequences (checksum {c:016x}, provenance {p:016x})" for side, (n, c, p) in found.items()}
        raise PackingError(f"the packed output holds {words['packed output']}, the input {words['input']}; nothing "
                           f"published")
    return found["input"][1]


def _description(settings: PackSettings, packing_plan, shards: list[dict], sources: list[str], checksum_in: int,
                 seconds: dict, digest: str, inputs_digest: str, histogram_sha256: str) -> DatasetInfo:
    """The packed dataset's metadata.json: its shards, what the plan made of the inputs, and the
    digests a rerun compares."""
    shapes = settings.shapes
    return DatasetInfo(
        packed=True, shapes=shapes, num_sequences=packing_plan.num_sequences, num_records=packing_plan.num_packs,
        files=tuple(DataFile(s["file"], s["bytes"], s["num_packs"], s["num_sequences"], s["checksum"], s["head"])
                    for s in shards),
        sources=tuple(sources), checksum=f"{checksum_in:016x}", histogram_sha256=histogram_sha256,
        details={
            "algorithm": settings.algorithm,
            "num_tokens": packing_plan.num_tokens,
            "efficiency": packing_plan.efficiency,
            "lower_bound_packs": packing_plan.lower_bound_packs,
            "padding_fraction_unpacked": 1.0 - packing_plan.num_tokens / (packing_plan.num_sequences
                                                                          * shapes.max_seq_length),
            "seed": settings.seed,
            "seconds": seconds,  # of this run (a resumed run times only what it redid)
            "run_digest": digest,  # settings and sources' paths: another run's directory is refused
            "inputs_digest": inputs_digest,  # the sources' content: when it changed, the run is done again
        })


def _finished_run(output_dir: str, work: str, digest: str, inputs_digest: str) -> dict | None:
    """The metadata of a finished run with the same settings and inputs in `output_dir`; None when
    there is none, or when its inputs' content has changed since (its output is then removed)."""
    info = read_dataset_info(output_dir)
    if info is None:
        return None
    if info.details.get("run_digest") != digest:
        raise OutputDirectoryError(f"{output_dir}: already holds packed data made with other settings or "
                                   f"inputs; use a new --output_dir or remove it")
    if info.details.get("inputs_digest") != inputs_digest:
        logging.warning("%s: the input files changed since they were packed here; packing them again", output_dir)
        _remove_outputs(output_dir, work)
        return None
    logging.info("%s: already packed with these settings and inputs; nothing to do", output_dir)
    return info.to_dict()


def _remove_outputs(output_dir: str, work: str) -> None:
    """Removes a packing run's outputs and work (its metadata.json first: nothing looks finished)."""
    for name in [METADATA_FILE, HISTOGRAM_FILE] + files.listdir(output_dir):
        if name in (METADATA_FILE, HISTOGRAM_FILE) or name.startswith("packed-"):
            if files.exists(os.path.join(output_dir, name)):
                files.remove(os.path.join(output_dir, name))
    files.rmtree(work)


# The layout of .work (its files and row format); an unfinished run of another layout starts over.
WORK_FORMAT = 3


def _claim(output_dir: str, work: str, identity: dict, digest: str, inputs_digest: str) -> None:
    """Refuses a directory that holds another run; records this run's identity for resuming. An
    unfinished run whose inputs changed since, or left by another version, starts over."""
    marker = os.path.join(work, "run.json")
    if files.exists(marker):
        with files.open_file(marker) as f:
            previous = json.load(f)
        if previous.get("digest") != digest:
            raise OutputDirectoryError(f"{output_dir}: holds an unfinished packing run with other settings "
                                       f"or inputs; use a new --output_dir or remove it")
        gone = _shards_gone(output_dir, work)
        if previous.get("work_format") != WORK_FORMAT or previous.get("inputs_digest") != inputs_digest:
            logging.warning("%s: the unfinished run was left by another version of the packer, or its input files "
                            "changed since; starting over", output_dir)
            _remove_outputs(output_dir, work)
            files.makedirs(work)
        elif gone:
            logging.warning("%s: %s, written by the unfinished run, is gone or changed since; starting over",
                            output_dir, gone)
            _remove_outputs(output_dir, work)
            files.makedirs(work)
    elif any(name.startswith("packed-") for name in files.listdir(output_dir)):
        raise OutputDirectoryError(f"{output_dir}: already holds packed data; use a new --output_dir or remove it")
    write_text_atomically(marker, json.dumps({"digest": digest, "inputs_digest": inputs_digest,
                                              "work_format": WORK_FORMAT, **identity}) + "\n")


def _shards_gone(output_dir: str, work: str) -> str | None:
    """The first output shard the work says was written that is not in `output_dir` as written
    (removed, or replaced since: the output on a bucket and the work on this host part ways)."""
    for name in files.listdir(work):
        if name.startswith("shard-") and name.endswith(".json"):
            with files.open_file(os.path.join(work, name)) as f:
                summary = json.load(f)
            path = os.path.join(output_dir, summary["file"])
            now = FileIdentity.of(path).content if files.exists(path) else None
            if now is None or any(summary.get(key) != value for key, value in now.items()):
                return summary["file"]
    return None


def _read_inputs(sources: list[str], work: str, shapes: Shapes, num_workers: int, expected: list) -> list[dict]:
    """Pass 1: every input file's histogram and checksum (files in parallel), each file's sequences
    checked against its entry in its metadata.json (`expected`, None where none)."""
    return _each_once(read_input, [(index, path, work, shapes, entry)
                                    for index, (path, entry) in enumerate(zip(sources, expected))],
                      [os.path.join(work, f"input-{index:05d}.json") for index in range(len(sources))],
                      num_workers, Progress("pack: reading", total=len(sources), unit="files"))


def _each_once(function, jobs: list[tuple], summaries: list[str], num_workers: int, progress: Progress) -> list[dict]:
    """Runs function(*job) for every job whose summary file (which it writes last) is missing, on
    threads; returns every job's summary. A resumed pass so redoes only unfinished jobs."""
    todo = [job for job, path in zip(jobs, summaries) if not files.exists(path)]
    progress.done = len(jobs) - len(todo)
    _in_parallel(function, todo, num_workers, progress)
    loaded = []
    for path in summaries:
        with files.open_file(path) as f:
            loaded.append(json.load(f))
    return loaded


def read_input(index: int, path: str, work: str, shapes: Shapes, expected: DataFile | None) -> dict:
    """Pass 1 for one input file: reads and checks its records; writes and returns its summary
    (histogram, checksums, largest token id) as `work/input-NNNNN.json`."""
    histogram = np.zeros(shapes.max_seq_length, dtype=np.int64)
    total, provenance, max_token_id = 0, 0, 0
    for first, batch in read_unpacked(path, shapes):
        rows = packer.rows_from_unpacked(batch, shapes, index, first)
        histogram += histogram_from_lengths(rows["length"], shapes.max_seq_length)
        total = packer.combine_checksums(total, packer.checksum(rows))
        provenance = packer.combine_checksums(provenance, packer.provenance_checksum(rows))
        max_token_id = max(max_token_id, int(rows["input_ids"].max()), int(rows["masked_lm_ids"].max()))
    if expected is not None:
        expected.require_sequences(path, int(histogram.sum()))
    summary = {"source": path, "file_index": index, "histogram": histogram.tolist(), "checksum": f"{total:016x}",
               "provenance": f"{provenance:016x}", "max_token_id": max_token_id}
    write_text_atomically(os.path.join(work, f"input-{index:05d}.json"), json.dumps(summary) + "\n")
    return summary


def _in_parallel(function, jobs: list[tuple], num_workers: int, progress: Progress) -> None:
    """Runs function(*job) for every job on `num_workers` threads (0: one per core).

    Threads, not processes: the work is in compiled loops that release the GIL (numba's nogil),
    NumPy and file I/O, so threads use every core without a process's start-up and imports.
    """
    num_workers = min(num_workers or os.cpu_count() or 1, max(len(jobs), 1))
    with concurrent.futures.ThreadPoolExecutor(num_workers) as pool:
        futures = [pool.submit(function, *job) for job in jobs]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()  # a job's error stops the run here
                progress.update(1)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    progress.close()


def _distribute(summaries: list[dict], histogram, work: str, shapes: Shapes, packing_plan, num_buckets: int,
                max_token_id: int, seed: int, num_workers: int) -> None:
    """Pass 2: read the inputs again (files in parallel), give every sequence its pack and
    position, and append it to its pack's bucket."""
    for name in files.listdir(work):
        if name.startswith("bucket-"):
            files.remove(os.path.join(work, name))  # an interrupted pass 2 starts over
    slots = packer.SlotTable(packing_plan.strategies, shapes.max_seq_length)
    before = sequences_before(summaries, shapes.max_seq_length)
    locks = [threading.Lock() for _ in range(num_buckets)]

    def distribute_file(index: int, summary: dict) -> None:
        for bucket, rows in assign_packs(summary, before[index], histogram, work, shapes, slots, num_buckets,
                                         max_token_id, seed):
            with locks[bucket], files.open_file(os.path.join(work, f"bucket-{bucket:05d}.bin"), "ab") as f:
                f.write(rows)

    _in_parallel(distribute_file, list(enumerate(summaries)), num_workers,
                 Progress("pack: assigning", total=len(summaries), unit="files"))
    write_text_atomically(os.path.join(work, "buckets.json"), json.dumps({"num_buckets": num_buckets}) + "\n")


def sequences_before(summaries: list[dict], max_seq_length: int) -> np.ndarray:
    """[file, length]: the sequences of each length in the input files before each file (the
    inputs' summaries, in order): a sequence's rank among those of its length continues across
    files. Row 0 and column 0 are zeros."""
    counts = np.zeros((len(summaries) + 1, max_seq_length + 1), dtype=np.int64)
    counts[1:, 1:] = np.cumsum([s["histogram"] for s in summaries], axis=0)
    return counts


def assign_packs(summary: dict, before: np.ndarray, histogram, work: str, shapes: Shapes, slots, num_buckets: int,
                 max_token_id: int, seed: int):
    """Pass 2 for one input file: reads it again and gives every sequence its pack (numbered in
    the random output order) and its position in the pack.

    Where a sequence goes depends only on its length and its rank among the sequences of that
    length (in the files' order), through keyed permutations: no table of the sequences is held
    anywhere, and whoever assigns a file, wherever, assigns it the same way.

    Args:
      summary: the file's summary from read_input (its path, index and checksum).
      before: the sequences of each length in the files before it (sequences_before's row).

    Yields:
      (bucket, rows): rows (packer.row_dtype) going to one bucket, a range of packs.

    Raises:
      InputsChangedError: the file's sequences differ from its first reading.
    """
    index = summary["file_index"]
    seen = before.copy()  # sequences of each length before this chunk
    total = 0
    for rows in _row_chunks(summary["source"], index, shapes, max_token_id):
        total = packer.combine_checksums(total, packer.checksum(rows))
        lengths = rows["length"].astype(np.int64)
        # Rank of each sequence among those of its length, in reading order.
        order = np.argsort(lengths, kind="stable")
        sorted_lengths = lengths[order]
        first_of_length = np.searchsorted(sorted_lengths, sorted_lengths)
        rank = np.empty(len(rows), dtype=np.int64)
        rank[order] = seen[sorted_lengths] + np.arange(len(rows)) - first_of_length
        seen += np.bincount(lengths, minlength=len(seen))
        if (rank >= histogram[lengths - 1]).any():  # more of a length than its first reading counted
            _input_changed(summary, work, index)
        slot = packer.keyed_permutation(rank, histogram[lengths - 1], key=seed * 1_000_003 + lengths)
        rows["pack"], rows["position"] = slots.locate(lengths, slot)
        # Pack numbers become output order: a random permutation of all packs.
        rows["pack"] = packer.keyed_permutation(rows["pack"], slots.num_packs, key=seed)
        bucket = rows["pack"] * num_buckets // slots.num_packs
        order = np.argsort(bucket, kind="stable")
        rows, bucket = rows[order], bucket[order]
        bounds = np.searchsorted(bucket, np.arange(num_buckets + 1))
        for b in np.flatnonzero(np.diff(bounds)):
            yield int(b), rows[bounds[b]:bounds[b + 1]]
    if f"{total:016x}" != summary["checksum"]:
        _input_changed(summary, work, index)


def _input_changed(summary: dict, work: str, index: int) -> None:
    """Raises InputsChangedError after forgetting the file's first reading, so that the same
    command reads it anew."""
    files.remove(os.path.join(work, f"input-{index:05d}.json"))
    files.remove(os.path.join(work, "run.json"))  # its identity was the old content's: the rerun starts over
    raise InputsChangedError(f"{summary['source']}: changed while being packed (its sequences differ from its first "
                             f"reading); nothing published. Run the same command again to pack what it holds now")


def _row_chunks(path: str, index: int, shapes: Shapes, max_token_id: int, chunk_rows: int = 1 << 15):
    """The rows of an input file, in chunks of at least `chunk_rows` (the last may be smaller):
    few, large writes to the buckets even when there are thousands of them."""
    chunk: list[np.ndarray] = []
    for first, batch in read_unpacked(path, shapes):
        chunk.append(packer.rows_from_unpacked(batch, shapes, index, first, max_token_id))
        if sum(len(rows) for rows in chunk) >= chunk_rows:
            yield np.concatenate(chunk)
            chunk = []
    if chunk:
        yield np.concatenate(chunk)


def shard_file(index: int, count: int) -> str:
    return f"packed-{index:05d}-of-{count:05d}.tfrecord"


def _write_packs(output_dir: str, work: str, settings: PackSettings, num_packs: int, num_buckets: int,
                 max_token_id: int, num_workers: int) -> list[dict]:
    """Pass 3: one output shard per bucket, in parallel; returns the shards' summaries."""
    return _each_once(_write_bucket,
                      [(output_dir, work, settings, num_packs, num_buckets, max_token_id, b) for b in range(num_buckets)],
                      [os.path.join(work, f"shard-{b:05d}.json") for b in range(num_buckets)],
                      num_workers, Progress("pack: writing", total=num_buckets, unit="shards"))


def _write_bucket(output_dir: str, work: str, settings: PackSettings, num_packs: int, num_buckets: int,
                  max_token_id: int, bucket: int) -> None:
    bucket_path = os.path.join(work, f"bucket-{bucket:05d}.bin")
    dtype = packer.row_dtype(settings.shapes.unpacked(), max_token_id)
    # Mapped, not read: rows are gathered chunk by chunk straight from the page cache.
    rows = (np.memmap(bucket_path, dtype=dtype, mode="r") if files.exists(bucket_path) and files.size(bucket_path)
            else np.zeros(0, dtype=dtype))
    write_shard(rows, output_dir, work, settings, num_packs, num_buckets, bucket)
    if files.exists(bucket_path):
        files.remove(bucket_path)


def write_shard(rows: np.ndarray, output_dir: str, work: str, settings: PackSettings, num_packs: int,
                num_buckets: int, bucket: int, chunk_packs: int = 512) -> dict:
    """Pass 3 for one bucket: assembles its packs from their rows (in any order: each row knows its
    pack and position), decodes them back to checksum the sequences, and writes
    `packed-NNNNN-of-NNNNN.tfrecord` (under a temporary name, then renamed) and, after it, its
    summary `work/shard-NNNNN.json`, which it returns."""
    shapes = settings.shapes
    first = -(-bucket * num_packs // num_buckets)  # the first pack p with p * num_buckets // num_packs == bucket
    last = -(-(bucket + 1) * num_packs // num_buckets)
    order = np.argsort(rows["pack"], kind="stable")  # indices: rows are only copied chunk by chunk
    bounds = np.searchsorted(rows["pack"][order], np.arange(first, last + chunk_packs, chunk_packs).clip(max=last))
    name = shard_file(bucket, num_buckets)
    num_sequences, total, provenance = 0, 0, 0
    with TFRecordWriter(os.path.join(output_dir, name)) as writer:
        # 512 packs at a time: temporaries small enough for the allocator to reuse them instead of
        # mapping fresh memory (page faults, zeroing) for every chunk.
        for chunk, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
            chunk_first = first + chunk * chunk_packs
            members = rows[order[start:end]]
            packs = packer.assemble_packs(members, members["pack"] - chunk_first, members["position"],
                                          min(chunk_packs, last - chunk_first), shapes)
            decoded = packer.unpack(packs, shapes.unpacked())
            num_sequences += len(decoded)
            total = packer.combine_checksums(total, packer.checksum(decoded))
            provenance = packer.combine_checksums(provenance, packer.provenance_checksum(members))
            writer.write_examples(packs)
    summary = {"file": name, "num_packs": last - first, "num_sequences": num_sequences, "checksum": f"{total:016x}",
               "provenance": f"{provenance:016x}", **FileIdentity.of(os.path.join(output_dir, name)).content}
    write_text_atomically(os.path.join(work, f"shard-{bucket:05d}.json"), json.dumps(summary) + "\n")
    return summary


def verify_packed_dataset(output_dir: str, num_workers: int = 0) -> dict:
    """Re-reads a packed dataset, decodes every pack into its sequences and checks each file and
    the whole against metadata.json: packs, sequences, the checksum of the sequences, and the
    file's size and head. Reads only: a dataset on read-only storage verifies.

    Files are read on `num_workers` threads (0: one per core).

    Returns:
      {"num_packs", "num_sequences", "checksum"} as read back.

    Raises:
      DatasetFilesError / VerifyError: naming the file and what differs.
    """
    info = read_dataset_info(output_dir)
    if info is None or not info.packed:
        raise OutputDirectoryError(f"{output_dir}: holds no packed dataset (no metadata.json of packed data)")
    info.select(output_dir, [os.path.join(output_dir, name) for name in info.file_names], "--output_dir",
                training=True)
    shapes = info.shapes
    found_in_file = {}

    def read_back(entry: DataFile):
        num_packs = num_sequences = total = 0
        path = os.path.join(output_dir, entry.name)
        for _, batch in read_packed(path, shapes):
            rows = packer.unpack(batch, shapes.unpacked())
            num_packs += len(batch["input_ids"])
            num_sequences += len(rows)
            total = packer.combine_checksums(total, packer.checksum(rows))
        found = {"records": num_packs, "sequences": num_sequences, "checksum": f"{total:016x}"}
        recorded = {key: getattr(entry, key) for key in found if getattr(entry, key) is not None}
        if {key: found[key] for key in recorded} != recorded:
            raise VerifyError(f"{path}: read back {found}, metadata.json says {recorded}")
        found_in_file[entry.name] = num_packs, num_sequences, total

    _in_parallel(read_back, [(entry,) for entry in info.files], num_workers,
                 Progress("verify", total=len(info.files), unit="files"))
    found = {"num_packs": sum(f[0] for f in found_in_file.values()),
             "num_sequences": sum(f[1] for f in found_in_file.values()),
             "checksum": f"{packer.combine_checksums(*[f[2] for f in found_in_file.values()]):016x}"}
    expected = {"num_packs": info.num_records, "num_sequences": info.num_sequences, "checksum": info.checksum}
    if found != expected:
        raise VerifyError(f"{output_dir}: read back {found}, metadata.json says {expected}")
    return found
