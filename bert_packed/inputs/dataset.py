"""A set of data files as a command reads them, opened once (Dataset.open).

Everything a command reads about its inputs is decided here, when it opens them: the files and
their identities, their kind (packed or not) and shapes (L, P, S), their counts, each
directory's metadata.json, the dataset's own length histogram, each file's origins (the
create_pretraining_data shard its records come from, through packing) and the held-out rule. A
command then holds the one value; no other module reads metadata.json for its inputs. It opens
them in two steps, so that its settings are checked against what the data says before any file
is read, and a finished output's rerun reads no more than it must: `Dataset.described` reads
the descriptions, `opened` checks the files against them; the histogram and the origins are
read when asked.

For example, with d made by create_pretraining_data (part-00000..part-00003 and eval-00000):

  Dataset.open(["d/part-00000", "d/part-00001"], "--input_file", training=True)
    -> files and identities as d/metadata.json records them, packed=False, d's shapes, the
       sequences of those two files, histogram None (not the whole dataset's), origins: each
       its own shard
  Dataset.open(glob("d/part-*"), ...)          -> the same, histogram d/histogram.json
  Dataset.open(["d/eval-00000"], ..., training=True) -> refused: a held-out file
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import numpy as np

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs import provenance
from bert_packed.inputs.dataset_info import (
    HISTOGRAM_FILE,
    METADATA_FILE,
    DataFile,
    DatasetFilesError,
    DatasetInfo,
    metadata_path,
    read_dataset_info,
)
from bert_packed.inputs.file_identity import FileIdentity, file_sha256
from bert_packed.inputs.histogram_file import HistogramError, load_histogram
from bert_packed.storage import files


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A set of data files as a command reads them: what their datasets' metadata.json say of
    them (Dataset.described), then checked against the disk (opened). The reference's own files,
    with no metadata.json, are known by their identity only.

    Attributes:
      files: the paths, in the order given.
      identity: each file's FileIdentity, once opened: as its metadata.json records it, else read
        then; () before.
      flag: the flag that named them, for messages.
      packed: whether the records are packs; None without a metadata.json.
      shapes: L, P and S of the records; None without a metadata.json.
      descriptions: the metadata.json of each directory of the files, by directory; {} without.
      num_sequences, num_records: in the files, once opened (0 when unknown: no counts for them).
      entries: each file's entry in its metadata.json, in order, once opened; () without one.
      whole: (directory, description) of the one dataset whose training files these all are,
        else None: its histogram.json is then the files' own (`histogram`).
    """

    files: tuple[str, ...]
    identity: tuple[FileIdentity, ...] = ()
    flag: str = ""
    packed: bool | None = None
    shapes: Shapes | None = None
    descriptions: dict[str, DatasetInfo] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    num_sequences: int = 0
    num_records: int = 0
    entries: tuple[DataFile, ...] = ()
    whole: tuple[str, DatasetInfo] | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def packing_factor(self) -> float:
        return self.num_sequences / self.num_records if self.num_records else 1.0

    @property
    def vocab_size(self) -> int | None:
        """The size of the vocabulary the records were made with (the largest, for files of several
        datasets); None where no metadata.json says it."""
        known = [info.vocab_size for info in self.descriptions.values() if info.vocab_size]
        return max(known) if known else None

    @functools.cached_property
    def histogram(self) -> np.ndarray | None:
        """The length histogram of the files when the dataset's histogram.json is theirs (they are
        all the training files of one dataset, and it is the file metadata.json pins), else None
        (after one line naming why, where there is one): whoever needs it counts the lengths."""
        return None if self.whole is None else _own_histogram(*self.whole)

    @functools.cached_property
    def origins(self) -> dict[str, tuple[provenance.Origin, ...]]:
        """Each file's origins (provenance.Origin: the create_pretraining_data shard its records
        come from, through packing), by path; read when asked (the sources' metadata.json)."""
        return provenance.origins(list(self.files), {provenance.directory_of(metadata_path(directory)): info
                                                     for directory, info in self.descriptions.items()})

    def lengths(self, max_seq_length: int | None, max_predictions_per_seq: int | None,
                defaults: tuple[int, int]) -> tuple[int, int]:
        """L and P: each as given (a flag the user set, else None), else as the data records it,
        else its default. Given and different from the record, the command's own check against
        the data refuses it, in one line."""
        recorded = defaults if self.shapes is None else (self.shapes.max_seq_length,
                                                         self.shapes.max_predictions_per_seq)
        return (max_seq_length if max_seq_length is not None else recorded[0],
                max_predictions_per_seq if max_predictions_per_seq is not None else recorded[1])

    @classmethod
    def open(cls, paths: list[str], flag: str, training: bool = False, held_out_allowed: bool = False) -> Dataset:
        """The files described (described), then opened (opened): the two at once."""
        return cls.described(paths, flag).opened(training, held_out_allowed)

    @classmethod
    def described(cls, paths: list[str], flag: str) -> Dataset:
        """What the metadata.json of the files' directories say of them, each read once, before any
        file is: their kind and shapes, all one (a command checks its settings against these
        before the disk is read; `opened` then checks the files).

        Raises:
          DatasetInfoError / SettingsError: a description that cannot be read, or files of datasets
            of other kinds or shapes, naming the flag and both.
        """
        directories = dict.fromkeys(os.path.dirname(path) for path in paths)
        described = _of_one_kind({directory: read_dataset_info(directory) for directory in directories}, flag)
        if not described:
            return cls(tuple(paths), flag=flag)
        first = next(iter(described.values()))
        return cls(tuple(paths), flag=flag, packed=first.packed, shapes=first.shapes, descriptions=described)

    def opened(self, training: bool = False, held_out_allowed: bool = False) -> Dataset:
        """These files checked against the disk: each listed in its metadata.json, of its recorded
        size and head (DatasetInfo.select), all training shards or all held-out files and, as
        training input, none holding held-out documents (packed from them), unless
        `held_out_allowed`; with their identities and counts.

        Args:
          training: whether they are training input (held-out documents are then refused).
          held_out_allowed: the user said the held-out files are training input
            (--train_on_held_out_files).

        Raises:
          DatasetFilesError / SettingsError: naming the flag or file.
        """
        paths, flag = list(self.files), self.flag
        if not self.descriptions:  # the reference's own files: known by their identity
            _require_uncompressed(paths, flag)
            return dataclasses.replace(self, identity=tuple(FileIdentity.of(path) for path in paths))
        groups: dict[str, list[str]] = {}
        for path in paths:
            groups.setdefault(os.path.dirname(path), []).append(path)
        chosen: dict[str, DataFile] = {}
        sequences = records = 0
        unknown, whole, held_out = False, None, {}
        for directory, info in self.descriptions.items():
            entries = info.select(directory, groups[directory], flag, training, held_out_allowed)
            chosen.update(zip(groups[directory], entries))
            held_out_names = {f.name for f in info.eval_files}
            held_out.update((path, os.path.basename(path) in held_out_names) for path in groups[directory])
            all_of_it = len(entries) == len(info.files) and {f.name for f in entries} == set(info.file_names)
            if all_of_it and len(self.descriptions) == 1:
                whole = (directory, info)
            if all(f.sequences is not None and f.records is not None for f in entries):
                sequences += sum(f.sequences for f in entries)
                records += sum(f.records for f in entries)
            elif all_of_it:
                sequences, records = sequences + info.num_sequences, records + info.num_records
            else:  # a part of a dataset whose metadata.json has no counts per file: unknown
                unknown = True
        _require_one_set(held_out, flag, held_out_allowed)
        entries = tuple(chosen[path] for path in paths)
        opened = dataclasses.replace(
            self, identity=tuple(FileIdentity(path, f.bytes, f.head) for path, f in zip(paths, entries)),
            num_sequences=0 if unknown else sequences, num_records=0 if unknown else records, entries=entries,
            whole=whole)
        if training and not held_out_allowed:
            _require_no_held_out_documents(opened.origins, flag)
        return opened


def _of_one_kind(infos: dict[str, DatasetInfo | None], flag: str) -> dict[str, DatasetInfo]:
    """The described directories of `infos` ({} if none is), refused unless all are and hold data of one
    kind and shape: checked before a command's own checks, whose advice would fit one of them only."""
    described = {directory: info for directory, info in infos.items() if info is not None}
    if described and len(described) < len(infos):
        bare = sorted(d for d, info in infos.items() if info is None)
        raise SettingsError(f"{flag}: {bare[0]} has no metadata.json but the other files' directories do; give "
                            f"one kind of data")
    if described:
        (first_directory, first), *others = described.items()
        for directory, info in others:
            if (info.packed, info.shapes) != (first.packed, first.shapes):
                raise SettingsError(f"{flag}: the files mix datasets of other kinds or shapes: {first_directory} "
                                    f"holds {_kind(first)}, {directory} {_kind(info)}; give one kind")
    return described


def _kind(info: DatasetInfo) -> str:
    """"packed data of L=128, P=20, S=3", say."""
    shapes = info.shapes
    return (f"{'packed' if info.packed else 'unpacked'} data of L={shapes.max_seq_length}, "
            f"P={shapes.max_predictions_per_seq}" + (f", S={shapes.max_sequences_per_pack}" if info.packed else ""))


def _require_one_set(held_out: dict[str, bool], flag: str, held_out_allowed: bool) -> None:
    """Raises DatasetFilesError when held-out files (True) and training shards (False) are given
    together, unless the user said held-out files are training input."""
    if len(set(held_out.values())) > 1 and not held_out_allowed:
        raise DatasetFilesError(f"{flag}: {next(p for p, h in held_out.items() if h)} is a held-out file and "
                                f"{next(p for p, h in held_out.items() if not h)} a training shard: give one set "
                                f"or the other (MLPerf never trains on the eval set, and an eval set of training "
                                f"records holds nothing out)")


def _require_uncompressed(paths: list[str], flag: str) -> None:
    """Raises DatasetFilesError for a compressed file: found now, not when the first batch (or
    evaluation) reads it."""
    compressed = next(((path, kind) for path in paths if (kind := files.compression(path))), None)
    if compressed:
        raise DatasetFilesError(f"{flag}: {compressed[0]} is {compressed[1]}-compressed; TFRecord files are read "
                                f"uncompressed: decompress it first")


def _require_no_held_out_documents(origins: dict[str, tuple[provenance.Origin, ...]], flag: str) -> None:
    """Raises DatasetFilesError when training files were packed from held-out documents (held-out
    files themselves are refused by DatasetInfo.select, naming the dataset's training shards)."""
    for path, found in origins.items():
        held_out = next((origin.file for origin in found if origin.held_out), None)
        if held_out is not None:
            raise DatasetFilesError(f"{flag}: {path} was packed from held-out evaluation documents ({held_out}); "
                                    f"train on packs of the training shards (part-*), or say "
                                    f"--train_on_held_out_files")


def _own_histogram(directory: str, info: DatasetInfo) -> np.ndarray | None:
    """The dataset's histogram.json when it is the dataset's own: the file metadata.json pinned (its
    SHA-256, when recorded), of the dataset's L, counting the sequences metadata.json counts. Else
    None, after one line: whoever needs the lengths counts them."""
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
