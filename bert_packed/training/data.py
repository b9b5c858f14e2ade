"""What a run reads: its training and eval data as values of their own (TrainData, EvalData: the
inputs they hold, shapes, packing factor, histogram and the plan's strategies). What the files'
metadata.json say (Dataset.described) is checked here against the run's settings, then the
files are opened (checked against the disk, held-out documents refused as training input: see
bert_packed.inputs.dataset), and the data holds them. They are facts, not settings: the command
line makes them once, and the run is handed them.

The counts a run logs and corrects its batch with are those of the files it reads. The reference's
own files (no metadata.json) are taken as the settings describe them. Every file's identity (size
and the hash of its beginning) is recorded in run.json, so a resumed run notices data that was
made again since.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from bert_packed.errors import SettingsError
from bert_packed.features import PACKED_RECORD_MODES, Shapes
from bert_packed.finetuning.encode import RepackedRows
from bert_packed.inputs.dataset import Dataset
from bert_packed.inputs.dataset_info import metadata_path
from bert_packed.inputs.file_identity import FileIdentity
from bert_packed.packing import DEFAULT_ALGORITHM, plan
from bert_packed.packing.packer import unpack
from bert_packed.packing.stream import length_histogram
from bert_packed.records import read_packed, read_unpacked
from bert_packed.storage.run_directory import RunDirectory
from bert_packed.training.batching import Batching
from bert_packed.training.config import TrainConfig, require, require_fits, require_packed_for, require_window
from bert_packed.training.input_pipeline import PipelineConfig

NO_INPUTS = Dataset(files=(), identity=())  # a run fed otherwise: rows, a measurement's batches


class _HoldsInputs:
    """The files a data value's opened inputs hold, and their identities, as its own."""

    inputs: Dataset

    @property
    def files(self) -> tuple[str, ...]:
        return self.inputs.files

    @property
    def identity(self) -> tuple[FileIdentity, ...]:
        return self.inputs.identity


@dataclasses.dataclass(frozen=True)
class TrainData(_HoldsInputs):
    """The training data as a run reads it: its files and what they hold (facts, not settings).

    Attributes:
      inputs: the files as Dataset.open opened them (their identities: a resumed run refuses
        data made again since it started, and a running one data changed when it reads the files
        again); none for a run fed otherwise (rows, a measurement's synthetic batches).
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

    shapes: Shapes
    input_mode: str
    inputs: Dataset = NO_INPUTS
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
class EvalData(_HoldsInputs):
    """The eval data as a run reads it (packed or unpacked records give the same figures).

    Attributes:
      inputs: the files as Dataset.open opened them (none: no evaluation).
      shapes: L, P and S of what the model is fed.
      input_mode: "padded" (unpacked records), "packed" (packed records) or "packed_online"
        (unpacked records packed as they are read).
      strategies: with "packed_online", as for TrainData.
      num_sequences: sequences in the files (0 when unknown): what a whole evaluation counts.
      rows: as for TrainData.
    """

    inputs: Dataset = NO_INPUTS
    shapes: Shapes | None = None
    input_mode: str = "padded"
    strategies: tuple = ()
    num_sequences: int = 0
    rows: dict | RepackedRows | None = dataclasses.field(default=None, repr=False, compare=False)


def _require_matches(inputs: Dataset, shapes: Shapes, input_mode: str | None, depth_given: bool,
                     vocab_size: int | None, mode_flag: str = "--input_mode") -> None:
    """Raises SettingsError when the settings cannot read the data: a vocabulary smaller than the
    one it was made with, packed records read as unpacked (or the other way), another depth
    given, another L or P.

    Args:
      inputs: the files, described (Dataset.described).
      shapes: L, P and S as the settings give them.
      input_mode: how the run reads them (None: packed or not, as for eval data).
      depth_given: whether S was given (else it is taken from the data).
      vocab_size: the BERT config's.
      mode_flag: the flag of `input_mode`, for messages.
    """
    if not inputs.descriptions:
        return
    flag, info = inputs.flag, next(iter(inputs.descriptions.values()))  # all of one kind and shape
    made_with = inputs.vocab_size
    if vocab_size and made_with and made_with > vocab_size:  # token ids the embeddings do not hold
        path = metadata_path(next(d for d, i in inputs.descriptions.items() if i.vocab_size == made_with))
        raise SettingsError(f"{flag}: made with a vocabulary of {made_with:,} tokens ({path}), but the BERT config "
                            f"has vocab_size={vocab_size:,}: give the --bert_config_file of that vocabulary (python -m "
                            f"bert_packed.vocab writes one with --bert_config_file)")
    packed = None if input_mode is None else input_mode in PACKED_RECORD_MODES  # packed_online: unpacked
    if packed is False and info.packed:
        raise SettingsError(f"{flag}: packed data (metadata.json), but {mode_flag}={input_mode} reads unpacked "
                            f"records; use {mode_flag}=packed")
    if packed and not info.packed:
        raise SettingsError(f"{flag}: unpacked data, but {mode_flag}={input_mode} reads packed records; pack it "
                            f"with scripts/pack_pretraining_data.py, or use {mode_flag}=padded or packed_online")
    depth = info.shapes.max_sequences_per_pack
    if packed and depth_given and depth != shapes.max_sequences_per_pack:
        raise SettingsError(f"{flag}: packed with max_sequences_per_pack={depth}, but --max_sequences_per_pack="
                            f"{shapes.max_sequences_per_pack}")
    differing = info.differing_lengths(shapes)
    if differing:
        name = differing[0]
        raise SettingsError(f"{flag}: the data has {name}={getattr(info.shapes, name)}, but --{name}="
                            f"{getattr(shapes, name)}")


def _as_described(inputs: Dataset, shapes: Shapes, input_mode: str | None) -> tuple[bool, Shapes]:
    """(packed or not, the shapes of the records): as their metadata.json says, else as the
    settings read them (after a warning: nothing can be checked)."""
    if inputs.packed is not None:
        return inputs.packed, inputs.shapes
    logging.warning("%s: no metadata.json beside the files; cannot check them against the flags", inputs.flag)
    packed = input_mode in PACKED_RECORD_MODES
    return packed, shapes if packed else shapes.unpacked()


def online_plan(inputs: Dataset, shapes: Shapes, run: RunDirectory | None = None) -> tuple[np.ndarray, object]:
    """The length histogram of the files (histogram) and the plan the on-the-fly packer fills (at
    depth S, by DEFAULT_ALGORITHM: `lp`).

    Returns:
      (histogram, PackingPlan).
    """
    counted = histogram(inputs, shapes, run)
    return counted, plan(counted, shapes.max_seq_length, DEFAULT_ALGORITHM, shapes.max_sequences_per_pack)


def histogram(inputs: Dataset, shapes: Shapes, run: RunDirectory | None = None) -> np.ndarray:
    """The length histogram of unpacked files: the dataset's histogram.json when that is the
    files' own (Dataset.histogram), else the one cached in the run directory for these very files,
    else counted in one pass (the trainer then caches it there)."""
    counted = inputs.histogram
    if counted is None and run is not None:
        counted = run.read_histogram("train", inputs.identity)
    if counted is None:
        counted = length_histogram(list(inputs.files), shapes, f"counting the sequences of {len(inputs.files)} files "
                                                               f"(once: the run directory keeps their lengths)")
    return np.asarray(counted)


def train_data(described: Dataset, shapes: Shapes, config: TrainConfig, depth_given: bool = False,
               held_out_allowed: bool = False, run: RunDirectory | None = None) -> TrainData:
    """The training data, checked against the settings; packed on the fly, with the plan of its
    histogram (online_plan), whose packing factor the batch correction and the betas use.

    Args:
      described: the files (--input_file), described (Dataset.described): checked against the
        settings, then opened as training input.
      shapes: L, P and S as the flags give them (checked against the data's).
      config: the run's settings (the input mode, when given; the bucket boundaries; the model,
        whose positions must hold L and whose vocabulary must hold the data's).
      depth_given: whether --max_sequences_per_pack was given (else it is the data's).
      held_out_allowed: --train_on_held_out_files.
      run: the run's directory, where a histogram counted here is cached.
    """
    batch = config.batch
    require(bool(described.files), "--input_file: no training files")
    require_fits(shapes.max_seq_length, config.model.bert)  # whatever the data holds, this cannot work
    # As given, else as the data's metadata.json says (padded without one, as the reference reads data).
    input_mode = batch.input_mode or ("packed" if described.packed else "padded")
    # These combinations first: they are what is wrong whatever the data holds.
    require_packed_for(input_mode, adjust_betas_for_packing=config.optimizer.adjust_betas_for_packing,
                       adjust_batch_for_packing=batch.adjust_batch_for_packing)
    require(all(1 <= b <= shapes.max_seq_length for b in batch.bucket_boundaries),
            f"--bucket_boundaries={','.join(map(str, batch.bucket_boundaries))}: each in [1, {shapes.max_seq_length}]")
    _require_matches(described, shapes, input_mode, depth_given, config.model.bert.vocab_size)
    packed, recorded_shapes = _as_described(described, shapes, input_mode)
    inputs = described.opened(training=True, held_out_allowed=held_out_allowed)
    if input_mode != "packed_online" and inputs.num_sequences:
        return TrainData(recorded_shapes, input_mode, inputs, packing_factor=inputs.packing_factor,
                         num_sequences=inputs.num_sequences)
    if packed:
        raise SettingsError("--input_file: packed data without the counts of a metadata.json: its packing factor is "
                            "not known; give the directory pack_pretraining_data.py wrote")
    if input_mode != "packed_online":
        # Unpacked files no metadata.json counts (the reference's own): counted once, so that
        # mllog.txt's train_samples is their number of sequences.
        counted = histogram(inputs, shapes, run)
        return TrainData(recorded_shapes, input_mode, inputs, num_sequences=int(counted.sum()),
                         histogram=tuple(counted.tolist()))
    counted, packing_plan = online_plan(inputs, shapes, run)
    return TrainData(shapes, input_mode, inputs, packing_factor=packing_plan.packing_factor,
                     num_sequences=int(counted.sum()), histogram=tuple(counted.tolist()),
                     strategies=packing_plan.strategies)


def eval_data(described: Dataset, shapes: Shapes, config: TrainConfig) -> EvalData:
    """The eval data, checked against the settings; read packed or not as its metadata.json says,
    or packed on the fly with --eval_input_mode=packed_online (in a window of
    --online_packing_window sequences).

    Args:
      described: the files, described (Dataset.described): checked against the settings, then
        opened.
      shapes: L, P and S as the flags give them.
      config: the run's settings.
    """
    require_fits(shapes.max_seq_length, config.model.bert)
    input_mode = config.eval.eval_input_mode
    if input_mode == "packed_online":
        require_window(config.batch.online_packing_window, shapes.max_sequences_per_pack)
    _require_matches(described, shapes, input_mode, False, config.model.bert.vocab_size, "--eval_input_mode")
    packed, recorded_shapes = _as_described(described, shapes, input_mode)
    inputs = described.opened()
    if input_mode != "packed_online":
        _require_counts(inputs, packed, recorded_shapes)
        return EvalData(inputs, recorded_shapes, "packed" if packed else "padded",
                        num_sequences=inputs.num_sequences)
    counted, packing_plan = online_plan(inputs, shapes)
    return EvalData(inputs, shapes, input_mode, strategies=packing_plan.strategies, num_sequences=int(counted.sum()))


def _require_counts(inputs: Dataset, packed: bool, shapes: Shapes) -> None:
    """Each eval file holds the sequences its metadata.json counts: read once before any training
    (an eval set is small), so that a changed file or description is named now, not after
    training by the first evaluation's count."""
    for identity, entry in zip(inputs.identity, inputs.entries):
        if packed:
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
