"""Packing on the fly: unpacked record files -> batches of packed features, in bounded memory.

What the input pipeline's `packed_online` mode runs (NumPy and the compiled reader; no
TensorFlow): records are read with the checked compiled reader, shuffled in a buffer, and handed
to an OnlinePacker guided by the plan of the data's length histogram; each pack it decides is
assembled (packer.assemble_packs, the offline packer's own assembly), so a batch is exactly
what offline packs of the same sequences give. An epoch is the files once, in an order drawn
from the seed and the epoch; at its end the packer is flushed, so every sequence of an epoch is
in exactly one pack of that epoch.

Worked example: three sequences of lengths 5, 3 and 8 at L = 8 and depth 2, with a plan whose
templates are (5, 3) and (8,), come out as two packs, [5, 3] and [8], whatever order they arrive
in (the packer keeps the 5 or the 3 waiting until its partner comes).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from bert_packed.console.progress import Progress
from bert_packed.features import Shapes
from bert_packed.packing import packer
from bert_packed.packing.histogram import histogram_from_lengths
from bert_packed.packing.online import OnlinePacker
from bert_packed.records import RecordError, read_unpacked


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    """How a stream of records becomes batches of packs.

    Attributes:
      shapes: L, P and S of the packs (the records' L and P).
      strategies: the plan of the data's histogram (packing.plan(...).strategies).
      online_packing_window: sequences the packer may hold at once.
      batch_size: packs a batch.
      seed: draws the file order and the shuffle of each epoch.
      training: shuffle, and repeat (forever, or `epochs` times); else one pass in file order. The
        last batch of a stream that ends is filled up with empty packs: every record once, none
        dropped.
      skip_batches: batches to pass over first (a resumed run's position): packed, not assembled.
      shuffle_buffer: records shuffled together before packing (training).
      read_batch: records read at a time.
    """

    shapes: Shapes
    strategies: tuple
    online_packing_window: int
    batch_size: int
    seed: int = 0
    training: bool = True
    skip_batches: int = 0
    shuffle_buffer: int = 10_000
    read_batch: int = 1024
    epochs: int | None = None


def length_histogram(paths: list[str], shapes: Shapes, label: str | None = None) -> np.ndarray:
    """The length histogram of unpacked record files, counted in one pass (records checked).

    Args:
      label: when given, progress is shown under it (a file at a time).
    """
    histogram = np.zeros(shapes.max_seq_length, dtype=np.int64)
    progress = Progress(label, len(paths), "files") if label else None
    for path in paths:
        for _, batch in read_unpacked(path, shapes.unpacked()):
            histogram += histogram_from_lengths((batch["input_mask"] != 0).sum(axis=1), shapes.max_seq_length)
        if progress:
            progress.update(1, f", {int(histogram.sum()):,} sequences")
    if progress:
        progress.close()
    return histogram


def packed_batches(paths: list[str], settings: StreamSettings, opened=None):
    """Yields batches of packs, {name: int32 [batch_size, length]}, under the packed record keys
    (Shapes.packed_lengths), as the offline packer writes them; the input pipeline's packed_online
    mode renames them for the model (features.model_features).

    Args:
      paths: unpacked TFRecord files (this input pipeline's share).
      settings: see StreamSettings.
      opened: when given, called with each file's path before it is read (each epoch): it may
        raise to stop the stream (a file changed under a running run).

    Raises:
      CorruptRecordError / RecordError: a bad record, its file and index named.
    """
    s = settings
    # What may wait at once: the packer's window, the shuffle buffer and one read, a batch of packs.
    pending = _Pending(paths, s.shapes, s.online_packing_window + s.shuffle_buffer + 2 * s.read_batch
                       + s.batch_size * s.shapes.max_sequences_per_pack)
    ready: list[np.ndarray] = []
    skip = s.skip_batches
    online = OnlinePacker(s.strategies, s.shapes.max_seq_length, s.shapes.max_sequences_per_pack, s.online_packing_window)
    epochs = range(s.epochs) if s.epochs is not None else itertools.count() if s.training else range(1)
    for epoch in epochs:
        rng = np.random.default_rng([s.seed, epoch])
        order = rng.permutation(len(paths)) if s.training else range(len(paths))
        chunks = _rows(paths, order, s.shapes, s.read_batch, opened)
        if s.training:
            chunks = _shuffled(chunks, rng, s.shuffle_buffer)
        for rows in itertools.chain(chunks, [None]):
            if rows is None:
                packs = online.flush()
            else:
                pending.add(rows)
                packs = online.add(rows["length"])
            ready.append(pending.take(packs))
            while sum(len(p) for p in ready) >= s.batch_size:
                batch, ready = _split(ready, s.batch_size)
                if skip:
                    skip -= 1
                    continue
                yield pending.assemble(batch)
    if ready and sum(len(p) for p in ready):
        yield pending.assemble(np.concatenate(ready), s.batch_size)


def _rows(paths: list[str], order, shapes: Shapes, read_batch: int, opened=None):
    """The records of the files, in `order`, as compact rows (packer.row_dtype), a batch at a time."""
    for index in order:
        if opened is not None:
            opened(paths[index])
        for first, batch in read_unpacked(paths[index], shapes.unpacked(), read_batch):
            yield packer.rows_from_unpacked(batch, shapes.unpacked(), int(index), first)


def _shuffled(chunks, rng: np.random.Generator, buffer: int):
    """The rows of `chunks`, shuffled in a buffer of about `buffer` rows."""
    held = []
    for rows in chunks:
        held.append(rows)
        if sum(len(r) for r in held) >= buffer:
            pool = np.concatenate(held)
            pool = pool[rng.permutation(len(pool))]
            yield pool[:len(pool) // 2]
            held = [pool[len(pool) // 2:]]
    if held:
        pool = np.concatenate(held)
        yield pool[rng.permutation(len(pool))]


def _split(ready: list[np.ndarray], size: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The first `size` packs (rows of member slots) of `ready`, and the rest."""
    packs = np.concatenate(ready)
    return packs[:size], [packs[size:]]


class _Pending:
    """Rows the packer holds (or has just decided), by slot, until their packs are assembled."""

    def __init__(self, paths: list[str], shapes: Shapes, capacity: int):
        self.paths = paths
        self.shapes = shapes
        self.rows = np.zeros(capacity, dtype=packer.row_dtype(shapes.unpacked()))
        self.free = list(range(capacity - 1, -1, -1))
        self.slot_of: dict[int, int] = {}
        self.next_id = 0

    def add(self, rows: np.ndarray) -> None:
        slots = [self.free.pop() for _ in range(len(rows))]
        self.rows[slots] = rows
        self.slot_of.update(zip(range(self.next_id, self.next_id + len(rows)), slots))
        self.next_id += len(rows)

    def take(self, packs: np.ndarray) -> np.ndarray:
        """The packs' members as slots ([K, S], -1 where empty); the ids are forgotten."""
        slots = np.full(packs.shape, -1, dtype=np.int64)
        for (k, j), sequence in np.ndenumerate(packs):
            if sequence >= 0:
                slots[k, j] = self.slot_of.pop(int(sequence))
        return slots

    def assemble(self, packs: np.ndarray, size: int | None = None) -> dict[str, np.ndarray]:
        """Packed features of packs given as member slots; `size` rows (empty packs at the end)."""
        cells = packs >= 0
        pack_of_row, position = np.nonzero(cells)
        slots = packs[cells]
        members = self.rows[slots]
        try:
            features = packer.assemble_packs(members, pack_of_row, position, size or len(packs), self.shapes)
        except RecordError:
            overflow = members[np.argmax(members["num_predictions"])]
            raise RecordError(f"{self.paths[overflow['file']]}: record {overflow['record']}: its pack holds more than "
                              f"{self.shapes.max_predictions_per_pack} predictions (P + S), {self.shapes.max_seq_length} "
                              f"tokens or {self.shapes.max_sequences_per_pack} sequences; were the records made with a "
                              f"larger --max_predictions_per_seq?") from None
        self.free.extend(slots.tolist())
        return features
