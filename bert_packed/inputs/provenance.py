"""Where records come from, and MLPerf's first rule: the eval set is never trained on.

A record's origin is the create_pretraining_data shard it was written to: a training shard
(part-*) or a held-out file (eval-*) of one creating run, which metadata.json identifies by its
settings and the SHA-256 of each text file it read (`source_sha256`). Packed data has the origins
of every file it packed (its metadata.json's `sources`): each pack may hold any of them.

Two origins of the same text are apart only when one is a held-out file and the other a training
shard of the same creating run (a copy of its directory included): its seeded split put each
document in one or the other. Another run over the same text (another seed, another
--eval_fraction) splits the documents another way, so its training shards hold some of this
run's held-out documents. Files without a metadata.json (the reference's own) have no origin:
only their identity is compared (bert_packed.inputs.input_files.require_disjoint).

For example, with d1 made with --eval_fraction=0.1 and d2 made from the same text with another
seed, and p1 packed from d1/part-*:

  training on          evaluating on     verdict
  d1/part-*            d1/eval-*         apart
  p1/packed-*          d1/eval-*         apart (p1's origins are d1's training shards)
  d1/part-*, d2/part-* d1/eval-*         refused: d2 was split another way
  d1/part-00000-000    d1/part-00000-001 refused: the same documents, masked again
  packs of d1/eval-*   d1/eval-*         refused: the eval records are trained on
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from bert_packed.errors import SettingsError
from bert_packed.inputs.dataset_info import DatasetInfo, DatasetInfoError, read_dataset_info
from bert_packed.inputs.input_files import require_disjoint
from bert_packed.storage import files

if TYPE_CHECKING:  # for the annotations only: inputs.dataset imports this module
    from bert_packed.inputs.dataset import Dataset


class Origin(NamedTuple):
    """The create_pretraining_data shard a record was written to.

    Attributes:
      file: the shard's path (absolute, as the packer records its sources).
      held_out: whether it is a held-out file (eval-*) rather than a training shard.
      creation: a digest of the creating run: its settings and its text files' SHA-256s.
      texts: the SHA-256s of the text files that run read.
    """

    file: str
    held_out: bool
    creation: str
    texts: frozenset[str]


def origins(paths: list[str], read: dict[str, DatasetInfo | None] | None = None) -> dict[str, tuple[Origin, ...]]:
    """The origins of each file, by path: one for a creating run's file, those of its sources for
    packed data, none for a file without a metadata.json. Each directory's is read once.

    Args:
      paths: the files.
      read: descriptions already read (None for none), by directory as directory_of spells it:
        not read again.
    """
    known: dict[str, tuple | None] = {}
    for directory, info in (read or {}).items():
        known[directory] = None  # a cycle of descriptions ends here
        known[directory] = None if info is None else _directory_origins(directory, known, info)
    return {path: _origins(path, known) for path in paths}


def _origins(path: str, known: dict) -> tuple[Origin, ...]:
    directory = directory_of(path)
    if directory not in known:
        known[directory] = None  # a cycle of descriptions ends here
        known[directory] = _directory_origins(directory, known)
    if known[directory] is None:
        return ()
    by_name, packed_from = known[directory]
    name = os.path.basename(path)
    return (by_name[name],) if name in by_name else packed_from


def _directory_origins(directory: str, known: dict,
                       info: DatasetInfo | None = None) -> tuple[dict[str, Origin], tuple[Origin, ...]]:
    """(the origin of each file a creating run wrote, by name; the origins of the files packed data
    was packed from). `info`: the directory's description, when already read."""
    if info is None:
        try:
            info = read_dataset_info(directory)
        except DatasetInfoError:  # a damaged description of data this was made from: no origin known
            return {}, ()
    if info is None:
        return {}, ()
    if info.creation is not None:
        return ({f.name: Origin(os.path.join(directory, f.name), held_out, info.creation, info.text_sha256)
                 for held_out, entries in ((False, info.files), (True, info.eval_files)) for f in entries}, ())
    sources = [path for path in info.sources if os.path.isabs(path) or "://" in path]
    return {}, tuple(dict.fromkeys(origin for path in sources for origin in _origins(path, known)))


def directory_of(path: str) -> str:
    """A file's directory, one spelling of it (a relative path made absolute, as the packer records
    its sources)."""
    return os.path.dirname(files.absolute(path))


def require_eval_apart(train: Dataset, evaluation: Dataset, eval_flag: str) -> None:
    """Raises InputFilesError or SettingsError when an eval record may be trained on: a training
    file given again as eval file (its path or its bytes: input_files.require_disjoint), or one
    whose records come from what the training data holds (require_apart)."""
    require_disjoint(list(train.files), "--input_file", list(evaluation.files), eval_flag)
    require_apart(train.origins, evaluation.origins, eval_flag)


def require_apart(train_origins: dict[str, tuple[Origin, ...]], eval_origins: dict[str, tuple[Origin, ...]],
                  eval_flag: str) -> None:
    """Raises SettingsError when an eval record may be trained on: it comes from a file the
    training data holds (directly or packed), or from a training shard of text the training data
    was made from, or from a held-out file of another creating run over that text.

    Args:
      train_origins, eval_origins: each file's origins (origins()), by path.
      eval_flag: the flag that named the eval files, for messages.
    """
    train_origins = [(path, origin) for path, found in train_origins.items() for origin in found]
    trained_files = {origin.file: path for path, origin in train_origins}
    for path, found in eval_origins.items():
        for origin in found:
            if origin.file in trained_files:
                raise SettingsError(f"{eval_flag}: {path} holds the records of {origin.file}, which the training "
                                    f"data holds too ({trained_files[origin.file]}): the eval set is never trained on")
            for trained, other in train_origins:
                if not origin.texts & other.texts or (origin.held_out and origin.creation == other.creation):
                    continue
                if not origin.held_out:
                    raise SettingsError(
                        f"{eval_flag}: {path} holds training records ({origin.file}) of a text file the training data "
                        f"({trained}) was made from too: its documents are trained on; evaluate on the held-out "
                        f"files (eval-*.tfrecord) of the training data's dataset, or on other text")
                raise SettingsError(
                    f"{eval_flag}: {path} holds documents held out from {directory_of(origin.file)}, but the training "
                    f"data ({trained}) was made from the same text by another run (another seed or split), which "
                    f"trains on some of them; train and evaluate on the files of one create_pretraining_data run")
