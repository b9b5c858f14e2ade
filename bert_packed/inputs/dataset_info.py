"""The dataset description, metadata.json: the only code that writes or reads that file.

A dataset is what its metadata.json says, checked against the disk before any use. Every dataset
directory (unpacked records from create_pretraining_data, packed records from
pack_pretraining_data) holds one metadata.json, in one layout for both kinds:

  format_version           3 (this layout)
  packed                   whether the records are packs (the packed layout of bert_packed.features)
  max_seq_length           L
  max_predictions_per_seq  P, predictions of one sequence
  max_sequences_per_pack   S (1 for unpacked data)
  num_sequences            sequences in `files`
  num_records              records in `files` (packs when packed)
  packing_factor           num_sequences / num_records
  checksum                 order-independent 64-bit checksum of the sequences (hex), or null
  files                    the data files, each {name (relative to the directory), bytes, records,
                           sequences, checksum (its sequences', or null), head (SHA-256 of its first
                           64 KiB)}: what identifies its content
  eval_files               files held out for evaluation, the same way (never training input)
  sources                  the input files the data was made from
  histogram_sha256         SHA-256 of the dataset's histogram.json (its lengths' counts), or null:
                           what pins that side file to this dataset
  ...                      what the producer adds (the packer: algorithm, efficiency, seconds...;
                           create_pretraining_data: settings, document counts...)

Packed data also carries `num_packs` (= num_records) and unpacked data `num_instances`
(= num_sequences), the names of the planner's --json report and of the shards' part-*.json.

A description that cannot be true is refused when read: a packing factor above the depth, counts
that do not add up over the files, a file listed twice. select() checks the files a command was
given against the description (cheaply: each file's size and the hash of its first 64 KiB; a
full read is --verify's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from bert_packed.errors import SettingsError, UserError
from bert_packed.features import Shapes
from bert_packed.inputs.file_identity import FileIdentity
from bert_packed.storage import files

METADATA_FILE = "metadata.json"
# A dataset's length histogram, beside its records (packing/histogram.py reads and writes it).
HISTOGRAM_FILE = "histogram.json"
FORMAT_VERSION = 3
# The longest sequence any BERT takes: the limit of the data commands and of the planner (up to
# it, the packer's compact row keeps positions as uint16).
MAX_SEQ_LENGTH_LIMIT = 65_536
# The shortest --max_seq_length the data commands take.
MIN_SEQ_LENGTH = 8


def require_seq_length(max_seq_length: int) -> None:
    """Raises SettingsError unless the data commands take `max_seq_length` (--max_seq_length)."""
    if not MIN_SEQ_LENGTH <= max_seq_length <= MAX_SEQ_LENGTH_LIMIT:
        raise SettingsError(f"--max_seq_length={max_seq_length}: must be in [{MIN_SEQ_LENGTH}, "
                            f"{MAX_SEQ_LENGTH_LIMIT:,}] (BERT uses 512; the longest variants 4,096 to 8,192)")

# The keys this module owns; every other key of the file is the producer's (DatasetInfo.details).
_OWN_KEYS = ("format_version", "packed", "max_seq_length", "max_predictions_per_seq", "max_sequences_per_pack",
             "num_sequences", "num_records", "packing_factor", "checksum", "files", "eval_files", "sources",
             "num_packs", "num_instances", "histogram_sha256")


class DatasetInfoError(UserError, ValueError):
    """A metadata.json cannot be read, is in an unknown layout, or describes what cannot be."""


class DatasetFilesError(UserError, ValueError):
    """The files on disk are not those metadata.json describes (missing, extra, cut short, foreign)."""


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One file of a dataset, and what identifies its content.

    Attributes:
      name: relative to the dataset's directory.
      bytes: its size (None when not recorded: its identity is then not checked).
      records: records in it (packs when packed).
      sequences: sequences in it.
      checksum: order-independent checksum of its sequences (hex), None when not computed.
      head: SHA-256 of its first 64 KiB (hex).
    """

    name: str
    bytes: int | None = None
    records: int | None = None
    sequences: int | None = None
    checksum: str | None = None
    head: str | None = None

    @classmethod
    def of(cls, path: str, records: int | None = None, sequences: int | None = None,
           checksum: str | None = None) -> DataFile:
        """The entry of the file at `path` (its name, size and head read from the disk)."""
        identity = FileIdentity.of(path)
        return cls(os.path.basename(path), identity.bytes, records, sequences, checksum, identity.head)

    @classmethod
    def from_json(cls, value) -> DataFile:
        """An entry of metadata.json's `files` or `eval_files`.

        Raises:
          DatasetInfoError: a field of another type than it can be (a count as a string, say).
        """
        entry = cls(**{field.name: value.get(field.name) for field in dataclasses.fields(cls)})
        for name in ("bytes", "records", "sequences"):
            count = getattr(entry, name)
            if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
                raise DatasetInfoError(f"the entry of {entry.name!r}: {name} is {count!r}, expected a count")
        if not isinstance(entry.name, str) or not all(isinstance(getattr(entry, name), (str, type(None)))
                                                      for name in ("checksum", "head")):
            raise DatasetInfoError(f"the entry {value!r}: expected a name and hashes as strings")
        return entry

    def require_sequences(self, path: str, counted: int) -> None:
        """Raises DatasetFilesError when the file at `path` holds another number of sequences than
        this entry records (read by whoever reads the file anyway)."""
        if self.sequences is not None and counted != self.sequences:
            raise DatasetFilesError(f"{path}: holds {counted:,} sequences, but its {METADATA_FILE} counts "
                                    f"{self.sequences:,}: the file or the description was changed; make the dataset "
                                    f"again")


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset directory holds; checks that it can be true when built.

    Attributes:
      packed: whether the records are packs.
      shapes: L, P and S (S = 1 for unpacked data).
      num_sequences: sequences in the data files.
      num_records: records in the data files (packs when packed).
      files: the data files (DataFile).
      sources: the input files the data was made from.
      checksum: order-independent checksum of the sequences (hex), None when not computed.
      details: what the producer recorded besides (algorithm, settings, statistics...).
      eval_files: files held out for evaluation (DataFile), never training input.
      histogram_sha256: SHA-256 of the dataset's histogram.json, None when not recorded.
    """

    packed: bool
    shapes: Shapes
    num_sequences: int
    num_records: int
    files: tuple[DataFile, ...]
    sources: tuple[str, ...] = ()
    checksum: str | None = None
    details: dict = dataclasses.field(default_factory=dict)
    eval_files: tuple[DataFile, ...] = ()
    histogram_sha256: str | None = None

    def __post_init__(self):
        s = self.shapes
        counts = (s.max_seq_length, s.max_predictions_per_seq, s.max_sequences_per_pack, self.num_sequences,
                  self.num_records)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
            raise DatasetInfoError(f"L, P, S and the counts must be whole numbers, got {counts}")
        if not 2 <= s.max_seq_length <= MAX_SEQ_LENGTH_LIMIT or s.max_predictions_per_seq < 1:
            raise DatasetInfoError(f"max_seq_length={s.max_seq_length} and max_predictions_per_seq="
                                   f"{s.max_predictions_per_seq} cannot be (L in [2, {MAX_SEQ_LENGTH_LIMIT}], P >= 1)")
        depth = s.max_sequences_per_pack
        if not 1 <= depth <= s.max_seq_length or (not self.packed and depth != 1):
            raise DatasetInfoError(f"max_sequences_per_pack={depth} cannot be for {'packed' if self.packed else 'unpacked'} "
                                   f"data of L={s.max_seq_length}")
        if not self.num_records <= self.num_sequences <= depth * self.num_records or (
                self.files and self.num_records < 1):
            raise DatasetInfoError(f"{self.num_sequences} sequences in {self.num_records} records at most {depth} a "
                                   f"record cannot be (a packing factor of {self.packing_factor:.3f} at depth {depth})")
        made_with = self.details.get("vocab_size")
        if made_with is not None and (not isinstance(made_with, int) or isinstance(made_with, bool) or made_with < 1):
            raise DatasetInfoError(f"vocab_size={made_with!r}: expected the vocabulary's size, a whole number of 1 or more")
        names = [f.name for f in self.files + self.eval_files]
        if len(set(names)) != len(names) or any(os.path.isabs(n) or ".." in n.split("/") for n in names):
            raise DatasetInfoError("a file listed twice, or outside the dataset's directory")
        for what, total in (("records", self.num_records), ("sequences", self.num_sequences)):
            parts = [getattr(f, what) for f in self.files]
            if self.files and None not in parts and sum(parts) != total:
                raise DatasetInfoError(f"its files hold {sum(parts)} {what} together, but num_{what} is {total}")

    @property
    def packing_factor(self) -> float:
        """Sequences per record (1.0 for unpacked data)."""
        return self.num_sequences / self.num_records if self.num_records else 1.0

    @property
    def vocab_size(self) -> int | None:
        """The size of the vocabulary the records were made with (create_pretraining_data's, carried
        on by the packer); None where not recorded (the reference's data)."""
        return self.details.get("vocab_size")

    @property
    def text_sha256(self) -> frozenset[str]:
        """The SHA-256 of each text file unpacked data was made from (create_pretraining_data's
        `source_sha256`); empty for data made otherwise (packed, or the reference's)."""
        return frozenset(digest for digest in self.details.get("source_sha256", ()) if digest)

    @property
    def creation(self) -> str | None:
        """What made unpacked data from text, as a digest: its settings (the vocabulary by its
        content) and its texts' content, whatever their paths. Two datasets of one creation hold
        the same documents in the same split; None where the text is not known."""
        if not self.text_sha256:
            return None
        settings = {k: v for k, v in self.details.get("settings", {}).items() if k != "vocab_file"}
        return hashlib.sha256(json.dumps([settings, self.details["source_sha256"]], sort_keys=True).encode()).hexdigest()

    def differing_lengths(self, shapes: Shapes) -> list[str]:
        """The names of L and P ("max_seq_length", "max_predictions_per_seq") whose values in
        `shapes` are not the data's, in that order."""
        return [name for name in ("max_seq_length", "max_predictions_per_seq")
                if getattr(self.shapes, name) != getattr(shapes, name)]

    @property
    def file_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    def to_dict(self) -> dict:
        """The metadata.json layout (format_version 3)."""
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
            "files": [dataclasses.asdict(f) for f in self.files],
            "eval_files": [dataclasses.asdict(f) for f in self.eval_files],
            "sources": list(self.sources),
            "histogram_sha256": self.histogram_sha256,
        }
        if self.packed:
            result["num_packs"] = self.num_records
        else:
            result["num_instances"] = self.num_sequences
        return {**result, **{k: v for k, v in self.details.items() if k not in _OWN_KEYS}}

    @classmethod
    def from_dict(cls, metadata: dict, source: str = METADATA_FILE) -> DatasetInfo:
        """Reads the metadata.json layout (format_version 3).

        Raises:
          DatasetInfoError: naming `source` and what is missing or cannot be.
        """
        if metadata.get("format_version") != FORMAT_VERSION:
            raise DatasetInfoError(f"{source}: not a dataset description this version reads (format_version "
                                   f"{metadata.get('format_version')!r}; expected {FORMAT_VERSION})")
        try:
            return cls(packed=bool(metadata["packed"]),
                       shapes=Shapes(metadata["max_seq_length"], metadata["max_predictions_per_seq"],
                                     metadata["max_sequences_per_pack"]),
                       num_sequences=metadata["num_sequences"], num_records=metadata["num_records"],
                       files=tuple(DataFile.from_json(f) for f in metadata["files"]),
                       sources=tuple(metadata.get("sources", ())), checksum=metadata.get("checksum"),
                       details={k: v for k, v in metadata.items() if k not in _OWN_KEYS},
                       eval_files=tuple(DataFile.from_json(f) for f in metadata.get("eval_files", ())),
                       histogram_sha256=metadata.get("histogram_sha256"))
        except (KeyError, TypeError, AttributeError) as e:
            raise DatasetInfoError(f"{source}: missing or malformed entry {e}") from None
        except DatasetInfoError as e:
            raise DatasetInfoError(f"{source}: {e}") from None

    def select(self, directory: str, paths: list[str], flag: str, training: bool,
               held_out_allowed: bool = False) -> tuple[DataFile, ...]:
        """The files of this dataset that `paths` name, each checked against the disk.

        Every file of the description must be on disk (a deleted shard is refused, not skipped);
        `paths` may name some of them (a subset is the user's choice), and nothing else.

        Args:
          directory: the dataset's directory.
          paths: the files a command was given (in its directory).
          flag: the flag that gave them, for messages.
          training: whether they are training input (held-out eval files are then refused).
          held_out_allowed: the user said the held-out files are training input.

        Raises:
          DatasetFilesError: naming the file and what is wrong with it.
        """
        known = {f.name: f for f in self.files}
        held_out = {f.name: f for f in self.eval_files}
        for entry in self.files:
            if not files.exists(os.path.join(directory, entry.name)):
                raise DatasetFilesError(f"{os.path.join(directory, entry.name)}: listed in {METADATA_FILE} but "
                                        f"missing: the dataset is incomplete (restore the file, or make the dataset "
                                        f"again)")
        chosen = []
        for path in paths:
            name = os.path.relpath(path, directory)
            entry = known.get(name) or held_out.get(name)
            if entry is None:
                raise DatasetFilesError(f"{flag}: {path} is not a file of the dataset in {directory} ({METADATA_FILE} "
                                        f"lists {len(known)}: {', '.join(list(known)[:3])}...); a file from "
                                        f"another dataset?")
            if training and name in held_out and not held_out_allowed:
                raise DatasetFilesError(f"{flag}: {path} holds the dataset's held-out evaluation documents; training "
                                        f"reads {os.path.join(directory, 'part-*.tfrecord')} (or say "
                                        f"--train_on_held_out_files)")
            check_identity(path, entry)
            chosen.append(entry)
        return tuple(chosen)


def check_identity(path: str, entry: DataFile) -> None:
    """Raises DatasetFilesError when the file at `path` is not the one `entry` describes (its size
    and the hash of its first 64 KiB)."""
    if entry.bytes is None:
        return
    difference = FileIdentity(path, entry.bytes, entry.head).difference()
    if difference is not None:
        raise DatasetFilesError(f"{path}: not the file {METADATA_FILE} describes ({difference}): cut short, replaced "
                                f"or rewritten since the dataset was made")


def check_size(path: str, entry: DataFile) -> None:
    """Raises DatasetFilesError when the file at `path` is not of the size `entry` records (one
    request, no read: a finished dataset's rerun checks each of its files so)."""
    if entry.bytes is not None and files.size(path) != entry.bytes:
        raise DatasetFilesError(f"{path}: {files.size(path):,} bytes, but {METADATA_FILE} records {entry.bytes:,}: "
                                f"cut short or rewritten since the dataset was made; remove {os.path.dirname(path)} "
                                f"and run the same command again")


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
      DatasetInfoError: the file is not JSON, not a dataset description, or one that cannot be.
    """
    path = metadata_path(directory)
    if not files.exists(path):
        return None
    try:
        metadata = files.read_json_object(path)
    except ValueError as e:
        raise DatasetInfoError(f"{path}: cannot read it as a dataset's description ({e})") from None
    return DatasetInfo.from_dict(metadata, path)


def require_listed_files(directory: str, info: DatasetInfo, names: list[str]) -> None:
    """Raises DatasetFilesError when a file that `info` lists is not among `names` (a listing of
    `directory`): a finished dataset with a shard deleted is not taken for finished.
    histogram.json is required too where `info` records its SHA-256.

    One listing, not a read of each file: a rerun on a finished output stays cheap on a bucket.
    """
    listed = [entry.name for entry in info.files + info.eval_files]
    listed += [HISTOGRAM_FILE] if info.histogram_sha256 is not None else []
    present = set(names)
    missing = [name for name in listed if name not in present]
    if missing:
        raise DatasetFilesError(f"{os.path.join(directory, missing[0])}: gone ({len(missing):,} of the "
                                f"{len(listed):,} files its {METADATA_FILE} lists): the dataset is no longer whole; "
                                f"remove {directory} and run the same command again")
