"""Unpacked TFRecords -> packed TFRecords + metadata.json, losslessly, in bounded memory.

Three passes, each a list of work units of an OutputJob (which resumes them, claims the output
and commits it), each spread over threads (the work is in compiled loops that release the GIL,
NumPy and file I/O):
1. Read every input file (records parsed and checked): its summary is its histogram and the
   checksum of its sequences.
2. Plan the packing on the merged histogram. Read the inputs again, give every sequence its pack
   and position (packer.SlotTable and keyed permutations: no per-sequence table in memory) and
   append it, as a compact row, to the bucket file of its pack (a work file). Packs are numbered
   in random output order and buckets are ranges of that order, sized to `bucket_bytes`. Each
   file's checksum must match its first reading.
3. For each bucket: load it, assemble its packs, decode them back and checksum the sequences,
   and write `packed-NNNNN-of-NNNNN.tfrecord`.

Reading the inputs twice costs less than writing every row to disk and reading it back: a row
is larger than its TFRecord, and disk writes are the slowest part of the job.

Peak memory is one bucket (default 256 MB of rows, memory-mapped) per worker in pass 3 and one
chunk (32,768 rows, ~120 MB at L=512 with its sorted copy) per worker in pass 2, whatever the
input size. The run is committed only if the sequences out (count and order-independent checksum,
decoded from the packs written) equal the sequences in."""

from __future__ import annotations

import logging
import math
import os
import threading
import time

import numpy as np

from bert_packed.console.progress import Progress
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.inputs.dataset_info import HISTOGRAM_FILE, DataFile, DatasetFilesError, DatasetInfo, metadata_path
from bert_packed.inputs.file_identity import FileIdentity, file_sha256
from bert_packed.inputs.histogram_file import save_histogram
from bert_packed.inputs.input_files import expand_globs
from bert_packed.packing import packer
from bert_packed.packing.histogram import histogram_from_lengths, merge_histograms
from bert_packed.packing.pack_settings import PackCommandSettings, PackSettings
from bert_packed.packing.plan import plan
from bert_packed.packing.verify import PackingError, audit_packs, verify_packed_dataset
from bert_packed.records import TFRecordWriter, read_unpacked
from bert_packed.storage import files
from bert_packed.storage.output_job import PACKED_DATA, OutputJob, WorkDamagedError, WorkUnits, in_parallel


def pack_pretraining_data(settings: PackCommandSettings) -> dict:
    """`python scripts/pack_pretraining_data.py` with these settings, as a function: the inputs'
    sequences packed into settings.output_dir (resumed where a run stopped), then, with verify,
    every pack read back and decoded into its sequences.

        metadata = pack_pretraining_data(PackCommandSettings(input_files="runs/data/unpacked/part-*",
                                                             output_dir="runs/data/packed", verify=True))
        metadata["packing_factor"]

    Returns:
      The packed dataset's metadata (metadata.json's content).

    Raises:
      UserError: a setting, an input record or the output directory that cannot make packs, in
        one line (pack_pretraining_dataset's errors).
    """
    inputs = Dataset.described(expand_globs(settings.input_files, "--input_files"), "--input_files")
    metadata = pack_pretraining_dataset(inputs, settings.output_dir, settings.pack_settings(inputs),
                                        settings.num_workers)
    if settings.verify:
        verify_written(settings.output_dir, settings.num_workers)
    return metadata


def verify_written(output_dir: str, num_workers: int = 0) -> None:
    """--verify: every pack of `output_dir` read back and decoded into its sequences, checked
    against the inputs' checksum (verify.verify_packed_dataset raises on any difference)."""
    found = verify_packed_dataset(output_dir, num_workers)
    logging.debug("verified: %d packs decode to the %d input sequences (checksum %s)", found["num_packs"],
                  found["num_sequences"], found["checksum"])


def pack_pretraining_dataset(inputs: Dataset, output_dir: str, settings: PackSettings,
                             num_workers: int = 0, passes=None) -> dict:
    """Packs the sequences of `inputs` into `output_dir`; returns the metadata.

    Args:
      inputs: unpacked TFRecord files, in a fixed order, described (Dataset.described): opened
        here once the output is known not to be finished (a finished one's rerun reads no more).
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
      InputsChangedError: an input file changed during the run.
      PackingError: the output would not hold exactly the input sequences.
    """
    passes = passes or LocalPasses(num_workers)
    # A run is its settings and inputs' paths (another is refused) and their content (when that
    # changed, the run is done again): each input's size and the hash of its beginning, cheap.
    sources = [files.absolute(path) for path in inputs.files]
    job = OutputJob(output_dir, passes.command, PACKED_DATA, {"settings": settings.to_dict(), "sources": sources},
                    sources, outputs=("packed-",), shared_work=passes.shared_work)
    done = job.finished()
    if done is not None:
        return done
    _require_unpacked(inputs, settings.shapes)  # refused inputs: nothing claimed
    inputs = inputs.opened()
    with job.writing() as done:
        if done is not None:
            return done
        summaries, packing_plan, shards, seconds = passes(job, list(inputs.entries or [None] * len(sources)),
                                                          settings)
        try:
            checksum_in = audit_packs(summaries, shards)
        except PackingError:
            job.units.start_over_next_time()  # whatever went wrong, the same command does it all again
            raise
        histogram_path = os.path.join(output_dir, HISTOGRAM_FILE)
        save_histogram(histogram_path, merge_histograms(*[s["histogram"] for s in summaries]))
        return job.commit(_description(settings, packing_plan, shards, sources, checksum_in, seconds,
                                       file_sha256(histogram_path), inputs.vocab_size))


def _require_unpacked(inputs: Dataset, shapes: Shapes) -> None:
    """Raises DatasetFilesError or SettingsError unless the inputs are unpacked records of the
    packer's L and P, where their metadata.json says it."""
    for directory, info in inputs.descriptions.items():
        path = metadata_path(directory)
        if info.packed:
            raise DatasetFilesError(f"--input_files: {path} describes packed data; the packer reads unpacked records "
                                    f"(create_pretraining_data's)")
        differing = info.differing_lengths(shapes)
        if differing:
            name = differing[0]
            raise SettingsError(f"--input_files: {path} says {name}={getattr(info.shapes, name)}, but --{name}="
                                f"{getattr(shapes, name)}")


# The names of the packer's work units and files (OutputJob keeps them in its work directory).
def input_unit(index: int) -> str:
    return f"input-{index:05d}"


def shard_unit(bucket: int) -> str:
    return f"shard-{bucket:05d}"


def bucket_file(bucket: int) -> str:
    return f"bucket-{bucket:05d}.bin"


class LocalPasses:
    """The three passes on this machine: files and shards on `num_workers` threads (0: one per
    core), the work (bucket files, appended to and memory-mapped) on its disk."""

    shared_work = False  # a bucket's output gets its work in a local directory (appends, memory maps)
    command = "pack_pretraining_data"  # in the output's lock, for whoever finds it held

    def __init__(self, num_workers: int = 0):
        self.num_workers = num_workers

    def __call__(self, job: OutputJob, expected: list, settings: PackSettings):
        """Runs the passes; returns (input summaries, plan, shard summaries, seconds per pass).

        Args:
          job: the run's OutputJob (its inputs, output directory and work units).
          expected: each input's entry in its dataset's metadata.json (None where none).
        """
        shapes, units = settings.shapes, job.units
        seconds = {}
        start = time.perf_counter()
        summaries = job.each_unit(read_input, [(input_unit(index), (index, path, units, shapes.unpacked(), entry))
                                               for index, (path, entry) in enumerate(zip(job.inputs, expected))],
                                  self.num_workers, Progress("pack: reading", total=len(job.inputs), unit="files"))
        seconds["read"] = time.perf_counter() - start
        start = time.perf_counter()
        histogram = merge_histograms(*[s["histogram"] for s in summaries])
        packing_plan = plan(histogram, shapes.max_seq_length, settings.algorithm, shapes.max_sequences_per_pack)
        max_token_id = max(s["max_token_id"] for s in summaries)
        num_buckets = bucket_count(settings, histogram, max_token_id, packing_plan.num_packs)
        if not units.done("buckets"):
            _distribute(summaries, histogram, units, shapes.unpacked(), packing_plan, num_buckets, max_token_id,
                        settings.seed, self.num_workers)
        seconds["plan_and_assign"] = time.perf_counter() - start
        start = time.perf_counter()
        shards = job.each_unit(_write_bucket, [(shard_unit(bucket), (job.output_dir, units, settings,
                                                                     packing_plan.num_packs, num_buckets, max_token_id,
                                                                     bucket))
                                               for bucket in range(num_buckets)],
                               self.num_workers, Progress("pack: writing", total=num_buckets, unit="shards"))
        seconds["write"] = time.perf_counter() - start
        return summaries, packing_plan, shards, seconds


def bucket_count(settings: PackSettings, histogram: np.ndarray, max_token_id: int, num_packs: int) -> int:
    """Output shards: --num_shards at least, more when a bucket of rows would exceed bucket_bytes,
    and never more than there are packs."""
    row_bytes = packer.row_dtype(settings.shapes.unpacked(), max_token_id).itemsize
    return min(max(settings.num_shards, math.ceil(int(histogram.sum()) * row_bytes / settings.bucket_bytes)), num_packs)


def _description(settings: PackSettings, packing_plan, shards: list[dict], sources: list[str], checksum_in: int,
                 seconds: dict, histogram_sha256: str, vocab_size: int | None) -> DatasetInfo:
    """The packed dataset's metadata.json: its shards and what the plan made of the inputs (the
    OutputJob adds the digests a rerun compares), and their vocabulary's size when known."""
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
            **({"vocab_size": vocab_size} if vocab_size else {}),
        })


def read_input(index: int, path: str, units: WorkUnits, shapes: Shapes, expected: DataFile | None) -> dict:
    """Pass 1 for one input file: reads and checks its records; saves and returns its unit's
    summary (histogram, checksums, largest token id)."""
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
    return units.save(input_unit(index), summary)


def _distribute(summaries: list[dict], histogram, units: WorkUnits, shapes: Shapes, packing_plan, num_buckets: int,
                max_token_id: int, seed: int, num_workers: int) -> None:
    """Pass 2: read the inputs again (files in parallel), give every sequence its pack and
    position, and append it to its pack's bucket. One unit for all files: an interrupted pass 2
    starts over."""
    for bucket in range(num_buckets):
        if files.exists(units.file(bucket_file(bucket))):
            files.remove(units.file(bucket_file(bucket)))
    slots = packer.SlotTable(packing_plan.strategies, shapes.max_seq_length)
    before = sequences_before(summaries, shapes.max_seq_length)
    locks = [threading.Lock() for _ in range(num_buckets)]

    def distribute_file(index: int, summary: dict) -> None:
        for bucket, rows in assign_packs(summary, before[index], histogram, units, shapes, slots, num_buckets,
                                         max_token_id, seed):
            with locks[bucket], files.open_file(units.file(bucket_file(bucket)), "ab") as f:
                f.write(rows)

    in_parallel(distribute_file, list(enumerate(summaries)), num_workers,
                Progress("pack: assigning", total=len(summaries), unit="files"))
    units.save("buckets", {"num_buckets": num_buckets})


def sequences_before(summaries: list[dict], max_seq_length: int) -> np.ndarray:
    """[file, length]: the sequences of each length in the input files before each file (the
    inputs' summaries, in order): a sequence's rank among those of its length continues across
    files. Row 0 and column 0 are zeros."""
    counts = np.zeros((len(summaries) + 1, max_seq_length + 1), dtype=np.int64)
    counts[1:, 1:] = np.cumsum([s["histogram"] for s in summaries], axis=0)
    return counts


def assign_packs(summary: dict, before: np.ndarray, histogram, units: WorkUnits, shapes: Shapes, slots, num_buckets: int,
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
            _input_changed(summary, units)
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
        _input_changed(summary, units)


def _input_changed(summary: dict, units: WorkUnits) -> None:
    """Raises InputsChangedError after forgetting the file's first reading and the run's claim,
    so that the same command starts over on what the file holds now."""
    units.forget(input_unit(summary["file_index"]))
    raise units.input_changed(summary["source"], "its sequences differ from its first reading")


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


def _write_bucket(output_dir: str, units: WorkUnits, settings: PackSettings, num_packs: int, num_buckets: int,
                  max_token_id: int, bucket: int) -> None:
    """Pass 3 for one bucket on this machine: its rows, mapped from its bucket file, into its
    shard; the bucket file is removed once the shard's unit is saved (the disk holds the rows
    once)."""
    bucket_path = units.file(bucket_file(bucket))
    dtype = packer.row_dtype(settings.shapes.unpacked(), max_token_id)
    if files.exists(bucket_path) and files.size(bucket_path) % dtype.itemsize:
        units.start_over_next_time()
        raise WorkDamagedError(f"{bucket_path}: damaged (cut short: not a whole number of rows); the same command, "
                               f"run again, starts over")
    # Mapped, not read: rows are gathered chunk by chunk straight from the page cache.
    rows = (np.memmap(bucket_path, dtype=dtype, mode="r") if files.exists(bucket_path) and files.size(bucket_path)
            else np.zeros(0, dtype=dtype))
    write_shard(rows, output_dir, units, settings, num_packs, num_buckets, bucket)
    if files.exists(bucket_path):
        files.remove(bucket_path)


def write_shard(rows: np.ndarray, output_dir: str, units: WorkUnits, settings: PackSettings, num_packs: int,
                num_buckets: int, bucket: int, chunk_packs: int = 512) -> dict:
    """Pass 3 for one bucket: assembles its packs from their rows (in any order: each row knows its
    pack and position), decodes them back to checksum the sequences, and writes
    `packed-NNNNN-of-NNNNN.tfrecord` (under a temporary name, then renamed) and, after it, saves
    its unit's summary (the file's name, size and head among it), which it returns."""
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
    return units.save(shard_unit(bucket), summary)
