"""The dataset description, metadata.json: the only code that writes or reads that file.

Every dataset directory (unpacked records from create_pretraining_data, packed records from
pack_pretraining_data) holds one metadata.json, in one layout for both kinds:

  format_version           2 (this layout)
  packed                   whether the records are packs (the packed layout of bert_packed.features)
  max_seq_length           L
  max_predictions_per_seq  P, predictions of one sequence
  max_sequences_per_pack   S (1 for unpacked data)
  num_sequences            sequences in `files`
  num_records              records in `files` (packs when packed)
  packing_factor           num_sequences / num_records
  checksum                 order-independent 64-bit checksum of the sequences (hex), or null
  files                    the data files, relative to the directory
  sources                  the input files the data was made from
  ...                      what the producer adds (the packer: algorithm, efficiency, seconds...;
                           create_pretraining_data: settings, document counts, eval_files...)

Packed data also carries `num_packs` (= num_records) and unpacked data `num_instances`
(= num_sequences), the names earlier releases used. Those releases wrote two other layouts,
without format_version; read_dataset_info still reads both.
"""

from __future__ import annotations

import dataclasses
import json
import os

from bert_packed import files
from bert_packed.errors import OutputDirectoryError, UserError
from bert_packed.features import Shapes
from bert_packed.run_directory import RunDirectory

METADATA_FILE = "metadata.json"
FORMAT_VERSION = 2

# The keys this module owns; every other key of the file is the producer's (DatasetInfo.details).
_OWN_KEYS = ("format_version", "packed", "max_seq_length", "max_predictions_per_seq", "max_sequences_per_pack",
             "num_sequences", "num_records", "packing_factor", "checksum", "files", "sources", "num_packs",
             "num_instances")


class DatasetInfoError(UserError, ValueError):
    """A metadata.json cannot be read or is in an unknown layout."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset directory holds.

    Attributes:
      packed: whether the records are packs.
      shapes: L, P and S (S = 1 for unpacked data).
      num_sequences: sequences in the data files.
      num_records: records in the data files (packs when packed).
      files: the data files, relative to the dataset's directory.
      sources: the input files the data was made from.
      checksum: order-independent checksum of the sequences (hex), None when not computed.
      details: what the producer recorded besides (algorithm, settings, statistics...).
    """

    packed: bool
    shapes: Shapes
    num_sequences: int
    num_records: int
    files: tuple[str, ...]
    sources: tuple[str, ...] = ()
    checksum: str | None = None
    details: dict = dataclasses.field(default_factory=dict)

    @property
    def packing_factor(self) -> float:
        """Sequences per record (1.0 for unpacked data)."""
        return self.num_sequences / self.num_records if self.num_records else 1.0

    def to_dict(self) -> dict:
        """The metadata.json layout (format_version 2)."""
        shapes = self.shapes
        result = {
            "format_version": FORMAT_VERSION,
            "packed": self.packed,
            "max_seq_length": shapes.max_seq_length,
            "max_predictions_per_seq": shapes.max_predictions_per_seq,
            "max_sequences_per_pack": shapes.max_sequences_per_pack,
            "num_sequences": self.num_sequences,
            "num_records": self.num_records,
            "packing_factor": self.packing_factor,
            "checksum": self.checksum,
            "files": list(self.files),
            "sources": list(self.sources),
        }
        if self.packed:
            result["num_packs"] = self.num_records
        else:
            result["num_instances"] = self.num_sequences
        return {**result, **{k: v for k, v in self.details.items() if k not in _OWN_KEYS}}

    @classmethod
    def from_dict(cls, metadata: dict, source: str = METADATA_FILE) -> DatasetInfo:
        """Reads any layout metadata.json has had.

        Raises:
          DatasetInfoError: naming `source` and what is missing.
        """
        try:
            version = metadata.get("format_version")
            if version == FORMAT_VERSION:
                return cls._from_current(metadata)
            if version is None and "algorithm" in metadata and "max_sequence_length" in metadata:
                return cls._from_packed_v1(metadata)
            if version is None and "settings" in metadata and "num_instances" in metadata:
                return cls._from_unpacked_v1(metadata)
        except (KeyError, TypeError, AttributeError) as e:
            raise DatasetInfoError(f"{source}: missing or malformed entry {e}") from None
        raise DatasetInfoError(f"{source}: not a dataset description this version reads (format_version "
                               f"{metadata.get('format_version')!r}; expected {FORMAT_VERSION})")

    @classmethod
    def _from_current(cls, m: dict) -> DatasetInfo:
        return cls(packed=bool(m["packed"]),
                   shapes=Shapes(m["max_seq_length"], m["max_predictions_per_seq"], m["max_sequences_per_pack"]),
                   num_sequences=m["num_sequences"], num_records=m["num_records"], files=tuple(m["files"]),
                   sources=tuple(m.get("sources", ())), checksum=m.get("checksum"),
                   details={k: v for k, v in m.items() if k not in _OWN_KEYS})

    @classmethod
    def _from_packed_v1(cls, m: dict) -> DatasetInfo:
        """Release 0.1 packed layout: max_sequence_length at the top, num_packs."""
        shapes = Shapes(m["max_sequence_length"], m["max_predictions_per_seq"], m["max_sequences_per_pack"])
        details = {k: v for k, v in m.items() if k not in _OWN_KEYS + ("max_sequence_length", "max_predictions")}
        return cls(packed=True, shapes=shapes, num_sequences=m["num_sequences"], num_records=m["num_packs"],
                   files=tuple(m["files"]), sources=tuple(m.get("sources", ())), checksum=m.get("checksum"),
                   details=details)

    @classmethod
    def _from_unpacked_v1(cls, m: dict) -> DatasetInfo:
        """Release 0.1 unpacked layout: L and P under settings.config, num_instances."""
        config = m["settings"]["config"]
        shapes = Shapes(config["max_seq_length"], config["max_predictions_per_seq"])
        return cls(packed=False, shapes=shapes, num_sequences=m["num_instances"], num_records=m["num_instances"],
                   files=tuple(m["files"]), sources=tuple(m.get("sources", ())),
                   details={k: v for k, v in m.items() if k not in _OWN_KEYS})


def metadata_path(directory: str) -> str:
    """Where a dataset directory keeps its description."""
    return os.path.join(directory, METADATA_FILE)


def write_dataset_info(directory: str, info: DatasetInfo) -> dict:
    """Writes `directory`/metadata.json atomically; returns what was written."""
    metadata = info.to_dict()
    files.write_text_atomically(metadata_path(directory), json.dumps(metadata, indent=1) + "\n")
    return metadata


def read_dataset_info(directory: str) -> DatasetInfo | None:
    """The description of the dataset in `directory`; None when it has no metadata.json.

    Raises:
      DatasetInfoError: the file is not JSON or not a dataset description.
    """
    path = metadata_path(directory)
    if not files.exists(path):
        return None
    try:
        with files.open_file(path) as f:
            metadata = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetInfoError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(metadata, dict):
        raise DatasetInfoError(f"{path}: expected a JSON object")
    return DatasetInfo.from_dict(metadata, path)


def dataset_info_of_files(paths: list[str]) -> DatasetInfo | None:
    """The description beside data files (in the directory of the first); None when there is none."""
    return read_dataset_info(os.path.dirname(paths[0]))


def refuse_other_output(directory: str, kind: str) -> None:
    """Refuses `directory` when it holds output of another kind than `kind`.

    Args:
      directory: an output directory about to be written.
      kind: what the command writes: "unpacked data", "packed data" or "a training run".

    Raises:
      OutputDirectoryError: naming what the directory holds.
    """
    info = read_dataset_info(directory)
    found = None if info is None else "packed data" if info.packed else "unpacked data"
    if found is None and RunDirectory(directory).holds_run():
        found = "a training run"
    if found is not None and found != kind:
        raise OutputDirectoryError(f"{directory}: holds {found}; {kind} would be mixed into it. Use another "
                                   f"directory")
