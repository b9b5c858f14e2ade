"""What a run reads: its training and eval data, described by their metadata.json and checked
against the run's settings before any work. The reference's own files (no metadata.json) are
taken as the settings describe them."""

from __future__ import annotations

import logging

from bert_packed.dataset_info import DatasetInfo, dataset_info_of_files
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.training.config import EvalData, TrainData


def describe(files: list[str], flag: str, shapes: Shapes, input_mode: str | None = None,
             depth_given: bool = False) -> DatasetInfo:
    """What the data is, from its metadata.json, checked against the settings.

    Args:
      files: the data files (metadata.json sits beside the first).
      flag: the flag that named them, for messages.
      shapes: L, P and S as the settings give them.
      input_mode: how the run reads the data (None: packed or not, as for eval data).
      depth_given: whether S was given (else it is taken from the data).

    Raises:
      SettingsError: naming the flag and the value the data has.
    """
    info = dataset_info_of_files(files)
    packed = None if input_mode is None else input_mode == "packed"
    if info is None:
        logging.warning("%s: no metadata.json beside the files; cannot check them against the flags", flag)
        depth = shapes.max_sequences_per_pack if packed else 1
        return DatasetInfo(bool(packed), Shapes(shapes.max_seq_length, shapes.max_predictions_per_seq, depth),
                           num_sequences=0, num_records=0, files=tuple(files))
    if packed is False and info.packed:
        raise SettingsError(f"{flag}: packed data (metadata.json), but --input_mode={input_mode} reads unpacked "
                            f"records; use --input_mode=packed")
    if packed and not info.packed:
        raise SettingsError(f"{flag}: unpacked data, but --input_mode=packed; pack it with "
                            f"scripts/pack_pretraining_data.py or use --input_mode=padded")
    depth = info.shapes.max_sequences_per_pack
    if packed and depth_given and depth != shapes.max_sequences_per_pack:
        raise SettingsError(f"{flag}: packed with max_sequences_per_pack={depth}, but --max_sequences_per_pack="
                            f"{shapes.max_sequences_per_pack}")
    for name in ("max_seq_length", "max_predictions_per_seq"):
        if getattr(info.shapes, name) != getattr(shapes, name):
            raise SettingsError(f"{flag}: the data has {name}={getattr(info.shapes, name)}, but --{name}="
                                f"{getattr(shapes, name)}")
    return info


def default_input_mode(files: list[str], given: str | None) -> str:
    """How to read the training data: as given, else as its metadata.json says (padded without
    one, as the reference reads data)."""
    if given is not None:
        return given
    return "packed" if getattr(dataset_info_of_files(files), "packed", False) else "padded"


def train_data(files: list[str], shapes: Shapes, input_mode: str, depth_given: bool = False, **settings) -> TrainData:
    """The training data, described and checked (describe).

    Args:
      settings: the other TrainData fields (batch_size, steps_per_update, ...).
    """
    info = describe(files, "--input_file", shapes, input_mode, depth_given)
    return TrainData(files=tuple(files), shapes=info.shapes, input_mode=input_mode,
                     packing_factor=info.packing_factor, num_sequences=info.num_sequences, **settings)


def eval_data(files: list[str], flag: str, shapes: Shapes, **settings) -> EvalData:
    """The eval data, packed or not as its metadata.json says, described and checked."""
    info = describe(files, flag, shapes)
    return EvalData(files=tuple(files), shapes=info.shapes, input_mode="packed" if info.packed else "padded",
                    **settings)
