"""The packed output checked: the packer's passes audited before the commit (audit_packs), and
a packed dataset read back against its metadata.json (pack_pretraining_data --verify, and the
packer's benchmark)."""

from __future__ import annotations

import os

import numpy as np

from bert_packed.console.progress import Progress
from bert_packed.errors import InternalError, OutputDirectoryError, UserError
from bert_packed.inputs.dataset_info import DataFile, read_dataset_info
from bert_packed.packing import packer
from bert_packed.records import read_packed
from bert_packed.storage.output_job import in_parallel


class PackingError(InternalError):
    """The packed output does not hold exactly the input sequences (a bug; nothing is published)."""


class VerifyError(UserError, ValueError):
    """Packed data read back is not what its metadata.json says (tampered, cut short, incomplete)."""


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

    in_parallel(read_back, [(entry,) for entry in info.files], num_workers,
                Progress("verify", total=len(info.files), unit="files"))
    found = {"num_packs": sum(f[0] for f in found_in_file.values()),
             "num_sequences": sum(f[1] for f in found_in_file.values()),
             "checksum": f"{packer.combine_checksums(*[f[2] for f in found_in_file.values()]):016x}"}
    expected = {"num_packs": info.num_records, "num_sequences": info.num_sequences, "checksum": info.checksum}
    if found != expected:
        raise VerifyError(f"{output_dir}: read back {found}, metadata.json says {expected}")
    return found
