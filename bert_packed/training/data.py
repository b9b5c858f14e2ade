"""What a run reads: its training and eval data as values of their own (TrainData, EvalData: the
files and their identity, shapes, packing factor, histogram and the plan's strategies),
described by their metadata.json and checked against the disk and the run's settings before any
work. They are facts, not settings: the command line makes them once, and the run is handed them.

A dataset is what its metadata.json says: the files a run is given must be files of it (held-out
eval files never train unless the user says so), every file it lists must be on disk, and each
given file must have the size and beginning recorded (bert_packed.inputs.dataset_info.select). The
counts a run logs and corrects its batch with are those of the files it reads. The reference's
own files (no metadata.json) are taken as the settings describe them. Every file's identity (size
and the hash of its beginning) is recorded in run.json, so a resumed run notices data that was
made again since.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

from bert_packed.errors import SettingsError
from bert_packed.features import PACKED_RECORD_MODES, Shapes
from bert_packed.finetuning.encode import RepackedRows
from bert_packed.inputs.dataset_info import HISTOGRAM_FILE, METADATA_FILE, Dataset, DatasetInfo, read_dataset_info
from bert_packed.inputs.file_identity import FileIdentity, file_sha256
from bert_packed.inputs.provenance import require_no_held_out_packs
from bert_packed.packing import DEFAULT_ALGORITHM, plan
from bert_packed.packing.histogram import HistogramError, load_histogram
from bert_packed.packing.packer import unpack
from bert_packed.packing.stream import length_histogram
from bert_packed.records import read_packed, read_unpacked
from bert_packed.storage import files
from bert_packed.storage.run_directory import RunDirectory
from bert_packed.training.batching import Batching
from bert_packed.training.config import TrainConfig, require, require_fits, require_packed_for, require_window
from bert_packed.training.input_pipeline import PipelineConfig


@dataclasses.dataclass(frozen=True)
class TrainData:
    """The training data as a run reads it: its files and what they hold (facts, not settings).

    Attributes:
      files: the TFRecord files, in order.
      identity: each file's FileIdentity: a resumed run refuses data made again since it
        started, and a running one data changed when it reads the files again.
      shapes: L, P and S of what the model is fed (S = 1 unless rows hold several sequences).
      input_mode: how the run reads them (config.INPUT_MODES).
      packing_factor: sequences per row (1.0 unpacked; packed on the fly, what the plan predicts).
      num_sequences: sequences in the files (0 when unknown).
      histogram: the files' length histogram, when the run needs it (packed on the fly, or no
        metadata.json counts the files): the run directory caches it.
      strategies: with "packed_online", the strategies of the plan the packer fills.
      rows: a fine-tuning set's rows, made in memory from `files` (rows_dataset.rows_dataset),
        read instead of records; RepackedRows when they are packed anew each epoch.
    """

    files: tuple[str, ...]
    identity: tuple[FileIdentity, ...]
    shapes: Shapes
    input_mode: str
    packing_factor: float = 1.0
    num_sequences: int = 0
    histogram: tuple[int, ...] = ()
    strategies: tuple = ()
    rows: dict | RepackedRows | None = dataclasses.field(default=None, repr=False, compare=False)

    def identity_settings(self) -> dict:
        """What the data makes of a run, for its identity in run.json (beside the files')."""
        return {"input_mode": self.input_mode, "packing_factor": self.packing_factor,
                "max_seq_length": self.shapes.max_seq_length,
                "max_predictions_per_seq": self.shapes.max_predictions_per_seq,
                "max_sequences_per_pack": self.shapes.max_sequences_per_pack}


@dataclasses.dataclass(frozen=True)
class EvalData:
    """The eval data as a run reads it (packed or unpacked records give the same figures).

    Attributes:
      files: the TFRecord files (empty: no evaluation).
      identity: as for TrainData.
      shapes: L, P and S of what the model is fed.
      input_mode: "padded" (unpacked records), "packed" (packed records) or "packed_online"
        (unpacked records packed as they are read).
      strategies: with "packed_online", as for TrainData.
      num_sequences: sequences in the files (0 when unknown): what a whole evaluation counts.
      rows: as for TrainData.
    """

    files: tuple[str, ...] = ()
    identity: tuple[FileIdentity, ...] = ()
    shapes: Shapes | None = None
    input_mode: str = "padded"
    strategies: tuple = ()
    num_sequences: int = 0
    rows: dict | RepackedRows | None = dataclasses.field(default=None, repr=False, compare=False)


def describe(paths: list[str], flag: str, shapes: Shapes, input_mode: str | None = None, depth_given: bool = False,
             training: bool = False, held_out_allowed: bool = False,
             vocab_size: int | None = None) -> tuple[Dataset, np.ndarray | None]:
    """What the data is, from its metadata.json (Dataset.open), checked against the settings, and
    its length histogram when a dataset's histogram.json is the files' own (every training file of
    one dataset), else None.

    Args:
      paths: the data files.
      flag: the flag that named them, for messages.
      shapes: L, P and S as the settings give them.
      input_mode: how the run reads the data (None: packed or not, as for eval data).
      depth_given: whether S was given (else it is taken from the data).
      training: whether this is training input (held-out eval files are refused).
      held_out_allowed: the user said held-out files are training input.

    Raises:
      SettingsError / DatasetFilesError / DatasetInfoError: naming the flag or file.
    """
    dataset = Dataset.open(paths, flag, training, held_out_allowed,
                           require=lambda info, path: _check_against_settings(info, path, flag, shapes, input_mode,
                                                                              depth_given, vocab_size))
    if dataset.packed is None:
        logging.warning("%s: no metadata.json beside the files; cannot check them against the flags", flag)
        packed = input_mode in PACKED_RECORD_MODES
        return dataclasses.replace(dataset, packed=packed, shapes=shapes if packed else shapes.unpacked()), None
    return dataset, None if dataset.whole is None else _dataset_histogram(*dataset.whole)


def _dataset_histogram(directory: str, info: DatasetInfo) -> np.ndarray | None:
    """The dataset's histogram.json when it is the dataset's own: the file metadata.json pinned (its
    SHA-256, when recorded), of the dataset's L, counting the sequences metadata.json counts. Else
    None, after one line: the run counts the lengths itself."""
    path = os.path.join(directory, HISTOGRAM_FILE)
    if not files.isfile(path):  # a directory or a pipe is not read (a pipe would block the run)
        if files.exists(path) or info.histogram_sha256 is not None:
            logging.warning("%s: %s; counting the lengths again", path, "not a regular file" if files.exists(path)
                            else f"missing, though {METADATA_FILE} records it")
        return None
    if info.histogram_sha256 is not None and file_sha256(path) != info.histogram_sha256:
        logging.warning("%s: not the histogram %s recorded (edited, or another dataset's); counting the lengths "
                        "again", path, METADATA_FILE)
        return None
    try:
        counted = load_histogram(path, info.shapes.max_seq_length)
    except HistogramError as e:
        logging.warning("%s; counting the lengths again", e)
        return None
    if int(counted.sum()) != info.num_sequences:
        logging.warning("%s: counts %d sequences, %s %d (another dataset's?); counting the lengths again", path,
                        int(counted.sum()), METADATA_FILE, info.num_sequences)
        return None
    return counted


def _check_against_settings(info: DatasetInfo, path: str, flag: str, shapes: Shapes, input_mode: str | None,
                            depth_given: bool, vocab_size: int | None) -> None:
    made_with = info.vocab_size
    if vocab_size and made_with and made_with > vocab_size:  # token ids the embeddings do not hold
        raise SettingsError(f"{flag}: made with a vocabulary of {made_with:,} tokens ({path}), but the BERT config "
                            f"has vocab_size={vocab_size:,}: give the --bert_config_file of that vocabulary (python -m "
                            f"bert_packed.vocab writes one with --bert_config_file)")
    packed = None if input_mode is None else input_mode in PACKED_RECORD_MODES  # packed_online: unpacked
    if packed is False and info.packed:
        raise SettingsError(f"{flag}: packed data (metadata.json), but --input_mode={input_mode} reads unpacked "
                            f"records; use --input_mode=packed")
    if packed and not info.packed:
        raise SettingsError(f"{flag}: unpacked data, but --input_mode={input_mode} reads packed records; pack it "
                            f"with scripts/pack_pretraining_data.py, or use --input_mode=padded or packed_online")
    depth = info.shapes.max_sequences_per_pack
    if packed and depth_given and depth != shapes.max_sequences_per_pack:
        raise SettingsError(f"{flag}: packed with max_sequences_per_pack={depth}, but --max_sequences_per_pack="
                            f"{shapes.max_sequences_per_pack}")
    differing = info.differing_lengths(shapes)
    if differing:
        name = differing[0]
        raise SettingsError(f"{flag}: the data has {name}={getattr(info.shapes, name)}, but --{name}="
                            f"{getattr(shapes, name)}")


def default_input_mode(paths: list[str], given: str | None) -> str:
    """How to read the training data: as given, else as its metadata.json says (padded without
    one, as the reference reads data)."""
    if given is not None:
        return given
    info = read_dataset_info(os.path.dirname(paths[0]))
    return "packed" if info is not None and info.packed else "padded"


def online_plan(paths: list[str], described: Dataset, own_histogram: np.ndarray | None, shapes: Shapes,
                run: RunDirectory | None = None) -> tuple[np.ndarray, object]:
    """The length histogram of the files (histogram) and the plan the on-the-fly packer fills (at
    depth S, by DEFAULT_ALGORITHM: `lp`).

    Returns:
      (histogram, PackingPlan).
    """
    counted = histogram(paths, described, own_histogram, shapes, run)
    return counted, plan(counted, shapes.max_seq_length, DEFAULT_ALGORITHM, shapes.max_sequences_per_pack)


def histogram(paths: list[str], described: Dataset, own_histogram: np.ndarray | None, shapes: Shapes,
              run: RunDirectory | None = None) -> np.ndarray:
    """The length histogram of unpacked files: the dataset's histogram.json when that is the
    files' own (`own_histogram`), else the one cached in the run directory for these very files,
    else counted in one pass (the trainer then caches it there)."""
    counted = own_histogram
    if counted is None and run is not None:
        counted = run.read_histogram("train", described.identity)
    if counted is None:
        counted = length_histogram(paths, shapes, f"counting the sequences of {len(paths)} files (once: the run "
                                                  f"directory keeps their lengths)")
    return np.asarray(counted)


def train_data(paths: list[str], shapes: Shapes, config: TrainConfig, depth_given: bool = False,
               held_out_allowed: bool = False, run: RunDirectory | None = None) -> TrainData:
    """The training data, described and checked (describe); packed on the fly, with the plan of
    its histogram (online_plan), whose packing factor the batch correction and the betas use.

    Args:
      paths: the files (--input_file).
      shapes: L, P and S as the flags give them (checked against the data's metadata.json).
      config: the run's settings (the input mode, when given; the bucket boundaries; the model,
        whose positions must hold L).
      depth_given: whether --max_sequences_per_pack was given (else it is the data's).
      held_out_allowed: --train_on_held_out_files.
      vocab_size: the BERT config's (None: not checked); data made with a larger vocabulary is refused.
      run: the run's directory, where a histogram counted here is cached.
    """
    batch = config.batch
    require(bool(paths), "--input_file: no training files")
    require_fits(shapes.max_seq_length, config.model.bert)  # whatever the data holds, this cannot work
    input_mode = default_input_mode(paths, batch.input_mode)
    # These combinations first: they are what is wrong whatever the data holds.
    require_packed_for(input_mode, adjust_betas_for_packing=config.optimizer.adjust_betas_for_packing,
                       adjust_batch_for_packing=batch.adjust_batch_for_packing)
    require(all(1 <= b <= shapes.max_seq_length for b in batch.bucket_boundaries),
            f"--bucket_boundaries={','.join(map(str, batch.bucket_boundaries))}: each in [1, {shapes.max_seq_length}]")
    described, own_histogram = describe(paths, "--input_file", shapes, input_mode, depth_given, training=True,
                                        held_out_allowed=held_out_allowed, vocab_size=config.model.bert.vocab_size)
    require_no_held_out_packs(paths, held_out_allowed)
    facts = dict(files=tuple(paths), identity=described.identity, input_mode=input_mode)
    if input_mode != "packed_online" and described.num_sequences:
        return TrainData(shapes=described.shapes, packing_factor=described.packing_factor,
                         num_sequences=described.num_sequences, **facts)
    if described.packed:
        raise SettingsError("--input_file: packed data without the counts of a metadata.json: its packing factor is "
                            "not known; give the directory pack_pretraining_data.py wrote")
    if input_mode != "packed_online":
        # Unpacked files no metadata.json counts (the reference's own): counted once, so that
        # mllog.txt's train_samples is their number of sequences.
        counted = histogram(paths, described, own_histogram, shapes, run)
        return TrainData(shapes=described.shapes, num_sequences=int(counted.sum()),
                         histogram=tuple(counted.tolist()), **facts)
    counted, packing_plan = online_plan(paths, described, own_histogram, shapes, run)
    return TrainData(shapes=shapes, packing_factor=packing_plan.packing_factor, num_sequences=int(counted.sum()),
                     histogram=tuple(counted.tolist()), strategies=packing_plan.strategies, **facts)


def eval_data(paths: list[str], flag: str, shapes: Shapes, config: TrainConfig) -> EvalData:
    """The eval data, described and checked; read packed or not as its metadata.json says, or
    packed on the fly with --eval_input_mode=packed_online (in a window of
    --online_packing_window sequences)."""
    require_fits(shapes.max_seq_length, config.model.bert)
    input_mode = config.eval.eval_input_mode
    if input_mode == "packed_online":
        require_window(config.batch.online_packing_window, shapes.max_sequences_per_pack)
    described, own_histogram = describe(paths, flag, shapes, input_mode, vocab_size=config.model.bert.vocab_size)
    if input_mode != "packed_online":
        _require_counts(described)
        return EvalData(files=tuple(paths), identity=described.identity, shapes=described.shapes,
                        input_mode="packed" if described.packed else "padded", num_sequences=described.num_sequences)
    counted, packing_plan = online_plan(paths, described, own_histogram, shapes)
    return EvalData(files=tuple(paths), identity=described.identity, shapes=shapes, input_mode=input_mode,
                    strategies=packing_plan.strategies, num_sequences=int(counted.sum()))


def _require_counts(described: Dataset) -> None:
    """Each eval file holds the sequences its metadata.json counts: read once before any training
    (an eval set is small), so that a changed file or description is named now, not after
    training by the first evaluation's count."""
    shapes = described.shapes
    for identity, entry in zip(described.identity, described.entries):
        if described.packed:
            counted = sum(len(unpack(batch, shapes.unpacked())) for _, batch in read_packed(identity.path, shapes))
        else:
            counted = sum(len(batch["input_ids"]) for _, batch in read_unpacked(identity.path, shapes))
        entry.require_sequences(identity.path, counted)


def train_pipeline(data: TrainData, config: TrainConfig, batching: Batching, skip_steps: int = 0) -> PipelineConfig:
    """How the input pipeline reads the training data for a run at micro-step `skip_steps`."""
    bert = config.model.bert
    return PipelineConfig(data.files, data.shapes, data.input_mode, batching.rows_per_micro_batch, True,
                          config.run.seed,
                          deterministic=config.run.deterministic, bucket_boundaries=config.batch.bucket_boundaries,
                          skip_steps=skip_steps, vocab_size=bert.vocab_size, type_vocab_size=bert.type_vocab_size,
                          strategies=data.strategies, online_packing_window=config.batch.online_packing_window,
                          identity=data.identity, rows=data.rows)


def eval_pipeline(data: EvalData, config: TrainConfig) -> PipelineConfig:
    """How the input pipeline reads the eval data: every record once (or --max_eval_steps batches)."""
    bert = config.model.bert
    return PipelineConfig(data.files, data.shapes, data.input_mode, config.eval.eval_batch_size, False,
                          config.run.seed, deterministic=config.run.deterministic,
                          max_batches=config.eval.max_eval_steps, vocab_size=bert.vocab_size,
                          type_vocab_size=bert.type_vocab_size, strategies=data.strategies,
                          online_packing_window=config.batch.online_packing_window, identity=data.identity,
                          rows=data.rows)
