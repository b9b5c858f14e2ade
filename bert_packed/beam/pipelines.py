"""create_pretraining_data and pack_pretraining_data as Apache Beam pipelines.

Each command is the single-machine one with its jobs run by a pipeline: the same checks before
(raised here, before anything is submitted), the same audit, and the same commit after
(metadata.json, last, written by this process once the pipeline has succeeded), so the output
is the same, byte for byte. What the pipeline changes is where the jobs run: on the workers of
Dataflow, Flink or Spark (Beam's --runner and its options), or, with no --runner, here on Beam's
FnApiRunner, which needs nothing downloaded (--direct_num_workers; --direct_running_mode=
multi_processing for processes).

create, one element a file: a worker reads and tokenizes the file and writes its dupe passes,
as create_pretraining_data's workers do (make_file_shards).

pack, two reads of every file and one shuffle of its rows:

    files --read_input--> summaries --Combine--> layout: histogram, plan, ranks  (a side input)
    files --assign_packs(layout)--> (bucket, rows) --GroupByKey--> write_shard --> audit

The summaries combine into the merged histogram, which the planner (any algorithm) plans; each
file's sequences of each length before it let any worker rank a file's sequences without the
others. A sequence is keyed by the bucket of its pack, a range of pack numbers; packs are
numbered in random order, so every bucket holds an even share of every length and no key is
hot (a quarter of Wikipedia's sequences are 512 long). The audit checks, before the pipeline
ends, that the shards hold every input sequence exactly once.

Faults: every file is written under a temporary name and renamed, and what a job writes is a
function of its input alone, so a retried bundle writes the same bytes again; a failed pipeline
commits nothing, and the same command again skips the files and shards already done.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import shlex
import sys
import threading
import time

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import PipelineRunner, create_runner
from apache_beam.transforms.environments import SubprocessSDKEnvironment

from bert_packed.beam import worker
from bert_packed.errors import SettingsError, UserError
from bert_packed.inputs.dataset import Dataset
from bert_packed.packing import packer
from bert_packed.packing.histogram import merge_histograms
from bert_packed.packing.pack_dataset import (
    PackSettings,
    assign_packs,
    bucket_count,
    input_unit,
    pack_pretraining_dataset,
    read_input,
    sequences_before,
    shard_unit,
    write_shard,
)
from bert_packed.packing.plan import plan
from bert_packed.packing.verify import audit_packs
from bert_packed.pretraining_data.create_dataset import (
    DatasetSettings,
    ShardJob,
    create_pretraining_dataset,
    make_file_shards,
)
from bert_packed.storage import files
from bert_packed.storage.output_job import OutputJob, WorkUnits


def pipeline_options(args: list[str]) -> PipelineOptions:
    """Beam's pipeline options from command-line arguments (--runner=DataflowRunner --project=...).

    Raises:
      SettingsError: an argument that is no pipeline option (Beam itself would drop it with a
        warning), an option's value Beam refuses (its argparse error), a runner Beam does not know,
        or options Beam's own check refuses for the runner (Dataflow's without --temp_location).
    """
    options = PipelineOptions(args)
    refused = io.StringIO()
    try:
        with contextlib.redirect_stderr(refused):  # argparse's usage, then its error, then an exit
            known = options.get_all_options(retain_unknown_options=True)
    except SystemExit:
        raise SettingsError(refused.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1]) from None
    unknown = sorted(set(known) - set(options.get_all_options()))
    # A value of its own (not after an option spelled without "="): Beam would drop it unsaid.
    stray = [arg for before, arg in zip(["="] + args, args)
             if not arg.startswith("-") and not (before.startswith("-") and "=" not in before)]
    if unknown or stray:
        raise SettingsError(f"{'--' + unknown[0] if unknown else repr(stray[0])}: neither a flag of this command nor "
                            f"a Beam pipeline option (--help lists both)")
    if options.view_as(DirectOptions).direct_num_workers < 0:
        raise SettingsError("--direct_num_workers must be >= 0 (0: one per core)")
    # Beam checks the options for its runner (Dataflow's project, region and temp_location, say) as
    # it builds a pipeline: here, before the output directory is claimed.
    errors = PipelineOptionsValidator(options, _runner(options)).validate()
    if errors:
        raise SettingsError(f"{errors[0]}{f' (and {len(errors) - 1} more: {errors[1]} ...)' if len(errors) > 1 else ''}"
                            f" (Beam's check of the pipeline options)")
    return options


def _runner(options: PipelineOptions) -> PipelineRunner:
    """--runner's runner, or with none Beam's FnApiRunner, which runs the pipeline here.

    Raises:
      SettingsError: a runner Beam does not know.
    """
    name = options.view_as(StandardOptions).runner
    if not name:
        return FnApiRunner()
    try:
        return create_runner(name)
    except ValueError as error:  # Beam's message lists the runners it knows
        raise SettingsError(f"--runner={name}: {error}") from None


def _here(options: PipelineOptions) -> tuple[FnApiRunner, PipelineOptions]:
    """Beam's FnApiRunner and the options to run it with: worker processes (multi_processing) are
    Beam's own, started as bert_packed.beam.worker, which ends with this process."""
    if options.view_as(DirectOptions).direct_running_mode != "multi_processing":
        return FnApiRunner(), options
    # For multi_processing Beam sets its own command; for in_memory it keeps the environment given
    # here, and starts direct_num_workers of it all the same.
    options = PipelineOptions.from_dictionary({**options.get_all_options(drop_default=True),
                                               "direct_running_mode": "in_memory"})
    command = f"exec {shlex.quote(sys.executable)} -m bert_packed.beam.worker"
    return FnApiRunner(default_environment=SubprocessSDKEnvironment.from_command_string(command)), options


class WorkerInputError(UserError, RuntimeError):
    """Bad input that a worker found (a corrupt record, say): its one line, as the worker said it."""


class RunnerError(UserError, RuntimeError):
    """The runner failed for a reason of its machine's (a worker process killed), not a bug here:
    one line, and the workers' log kept."""


# The thread that runs the pipeline: one left running (the command interrupted, or the runner
# failed) is not waited for when the command exits (bert_packed.cli.beam).
PIPELINE_THREAD = "pipeline"


def pipeline_left_running() -> bool:
    """Whether a pipeline's thread still runs (interrupted, or its runner failed)."""
    return any(thread.name == PIPELINE_THREAD and thread.is_alive() for thread in threading.enumerate())


def _run(options: PipelineOptions, build) -> float:
    """Builds the pipeline with build(pipeline) and runs it to the end; returns its seconds. With no
    --runner, Beam's FnApiRunner runs it here.

    The pipeline runs in a thread of its own, and this (the main) thread waits for it: Ctrl-C and
    SIGTERM, which Python delivers to the main thread, then stop the wait, never Beam's own code
    (interrupted while its workers start or stop, Beam waits for them forever).

    Raises:
      WorkerInputError: a worker's UserError, which a runner gives back as text (the worker's
        traceback in a RuntimeError of its own).
      RunnerError: a thread of the runner failed, the pipeline left running.
    """
    runner, options = (_runner(options), options) if options.view_as(StandardOptions).runner else _here(options)
    failed = []

    def run_pipeline():
        try:
            with beam.Pipeline(runner=runner, options=options) as pipeline:
                build(pipeline)
        except Exception as error:  # noqa: BLE001 - raised again in the main thread
            failed.append(error)

    # A thread of Beam's that fails (one watching a worker process that was killed, or could not
    # start) ends alone, and the pipeline waits for that worker forever: it fails the run instead.
    thread_failures = []
    excepthook = threading.excepthook
    threading.excepthook = lambda args: thread_failures.append(args.exc_value)
    start = time.perf_counter()
    # A daemon, as the threads Beam starts from it: an interrupted command exits without them.
    thread = threading.Thread(target=run_pipeline, name=PIPELINE_THREAD, daemon=True)
    if not options.view_as(StandardOptions).runner:  # its worker processes, if any, end with this one
        os.environ[worker.DRIVER] = json.dumps(files.this_process())
    try:
        thread.start()
        while thread.is_alive() and not thread_failures:
            thread.join(0.5)
        if thread_failures:
            thread.join(5)  # a failure as the pipeline ends lets it end
    finally:
        threading.excepthook = excepthook
        os.environ.pop(worker.DRIVER, None)
    if thread.is_alive():
        raise RunnerError(f"the runner failed: {type(thread_failures[0]).__name__}: {thread_failures[0]} (a worker "
                          f"process killed, out of memory say, or one that could not start). Finished files are kept; "
                          f"run the same command again to continue")
    if not failed:
        return time.perf_counter() - start
    error = failed[0]
    cause = error
    while cause is not None:  # a runner running the jobs in this process's threads wraps what they raised
        if isinstance(cause, UserError):
            raise cause
        cause = cause.__cause__ or cause.__context__
    for line in reversed(str(error).splitlines()):
        found = re.match(r"(bert_packed(?:\.\w+)+)\.(\w+): (.+)", line.strip())
        kind = found and getattr(importlib.import_module(found[1]), found[2], None)
        if isinstance(kind, type) and issubclass(kind, UserError):
            raise WorkerInputError(found[3]) from None
    raise error


def create_on_beam(input_files: list[str], output_dir: str, settings: DatasetSettings,
                   options: PipelineOptions) -> dict:
    """create_pretraining_dataset with each input file's shards written by a pipeline's worker.

    Returns:
      The metadata, also written to metadata.json: the same as create_pretraining_dataset's.
    """

    def make_shards(jobs: list[ShardJob], units: WorkUnits, output_dir: str, settings: DatasetSettings) -> None:
        if not jobs:
            return
        _run(options, lambda pipeline: (
            pipeline
            | "Files" >> beam.Create(jobs)
            | "Spread" >> beam.Reshuffle()
            | "Shards" >> beam.Map(make_file_shards, units, output_dir, settings)))

    return create_pretraining_dataset(input_files, output_dir, settings, make_shards=make_shards,
                                      command="bert_packed.beam create")


def pack_on_beam(inputs: Dataset, output_dir: str, settings: PackSettings, options: PipelineOptions) -> dict:
    """pack_pretraining_dataset with its passes run by a pipeline (BeamPasses).

    Returns:
      The metadata, also written to metadata.json: the same as pack_pretraining_dataset's but
      for its "seconds".
    """
    return pack_pretraining_dataset(inputs, output_dir, settings, passes=BeamPasses(options))


class BeamPasses:
    """The packer's three passes as one pipeline (pack_dataset.LocalPasses's interface).

    Its work units (each input's and each shard's summary) are in `output_dir/.work`, wherever
    that is: every worker saves there, and the same command again finds what is done.
    """

    shared_work = True
    command = "bert_packed.beam pack"

    def __init__(self, options: PipelineOptions):
        self.options = options

    def __call__(self, job: OutputJob, expected: list, settings: PackSettings):
        """Runs the pipeline; returns (input summaries, plan, shard summaries, seconds)."""
        inputs = [(index, path, entry) for index, (path, entry) in enumerate(zip(job.inputs, expected))]
        shapes, units, output_dir = settings.shapes, job.units, job.output_dir

        def build(pipeline):
            files_in = pipeline | "Files" >> beam.Create(inputs) | "Spread" >> beam.Reshuffle()
            summaries = files_in | "Read" >> beam.Map(_summary, units, shapes.unpacked())
            layout = beam.pvalue.AsSingleton(
                summaries | "Combine" >> beam.CombineGlobally(_MergeSummaries())
                | "Plan" >> beam.Map(_layout, settings, units))
            shards = (files_in
                      | "Assign" >> beam.FlatMap(_assign, layout, units, settings)
                      | "ByBucket" >> beam.GroupByKey()
                      | "Write" >> beam.Map(_write, layout, output_dir, units, settings))
            _ = (shards | "Shards" >> beam.combiners.ToList()
                 | "Audit" >> beam.Map(_audit, beam.pvalue.AsList(summaries), layout, units))

        seconds = _run(self.options, build)
        summaries = [units.load(input_unit(index)) for index in range(len(job.inputs))]
        histogram = merge_histograms(*[s["histogram"] for s in summaries])
        packing_plan = plan(histogram, shapes.max_seq_length, settings.algorithm, shapes.max_sequences_per_pack)
        num_buckets = bucket_count(settings, histogram, max(s["max_token_id"] for s in summaries),
                                   packing_plan.num_packs)
        shards = [units.load(shard_unit(bucket)) for bucket in range(num_buckets)]
        return summaries, packing_plan, shards, {"pipeline": seconds}


def _summary(element: tuple, units: WorkUnits, shapes) -> dict:
    """Pass 1 for one file: its summary, read back when an earlier run saved it."""
    index, path, expected = element
    done = units.done(input_unit(index))
    return units.load(input_unit(index)) if done else read_input(index, path, units, shapes, expected)


class _MergeSummaries(beam.CombineFn):
    """The inputs' summaries, by file index (a merge of small dicts: each a histogram and checksums)."""

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, accumulator: dict, summary: dict) -> dict:
        accumulator[summary["file_index"]] = summary
        return accumulator

    def merge_accumulators(self, accumulators) -> dict:
        merged = {}
        for accumulator in accumulators:
            merged.update(accumulator)
        return merged

    def extract_output(self, accumulator: dict) -> list[dict]:
        return [accumulator[index] for index in sorted(accumulator)]


def _layout(summaries: list[dict], settings: PackSettings, units: WorkUnits) -> dict:
    """What every worker of passes 2 and 3 needs: the plan of the merged histogram, each file's
    sequences of each length before it, the buckets, and which shards an earlier run wrote."""
    shapes = settings.shapes
    histogram = merge_histograms(*[s["histogram"] for s in summaries])
    packing_plan = plan(histogram, shapes.max_seq_length, settings.algorithm, shapes.max_sequences_per_pack)
    max_token_id = max(s["max_token_id"] for s in summaries)
    num_buckets = bucket_count(settings, histogram, max_token_id, packing_plan.num_packs)
    done = [bucket for bucket in range(num_buckets) if units.done(shard_unit(bucket))]
    return {"summaries": summaries, "histogram": histogram, "plan": packing_plan, "max_token_id": max_token_id,
            "before": sequences_before(summaries, shapes.max_seq_length), "num_buckets": num_buckets, "done": done}


def _assign(element: tuple, layout: dict, units: WorkUnits, settings: PackSettings):
    """Pass 2 for one file: (bucket, rows as bytes) for every bucket not written yet."""
    index = element[0]
    shapes = settings.shapes.unpacked()
    slots = packer.SlotTable(layout["plan"].strategies, shapes.max_seq_length)
    done = set(layout["done"])
    for bucket, rows in assign_packs(layout["summaries"][index], layout["before"][index], layout["histogram"], units,
                                     shapes, slots, layout["num_buckets"], layout["max_token_id"], settings.seed):
        if bucket not in done:
            yield bucket, rows.tobytes()


def _write(element: tuple, layout: dict, output_dir: str, units: WorkUnits, settings: PackSettings) -> dict:
    """Pass 3 for one bucket: its rows, from every file, into its shard."""
    bucket, parts = element
    dtype = packer.row_dtype(settings.shapes.unpacked(), layout["max_token_id"])
    rows = np.frombuffer(b"".join(parts), dtype=dtype)
    return write_shard(rows, output_dir, units, settings, layout["plan"].num_packs, layout["num_buckets"], bucket)


def _audit(written: list[dict], summaries: list[dict], layout: dict, units: WorkUnits) -> None:
    """Fails the pipeline unless the shards (written now, or by an earlier run) hold every input
    sequence exactly once."""
    earlier = [units.load(shard_unit(bucket)) for bucket in layout["done"]]
    audit_packs(summaries, written + earlier)
