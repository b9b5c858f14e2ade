"""Packing unpacked sequences into packs: assignment, assembly, decoding and checksums.

A sequence travels as a row of the structured dtype `row_dtype(shapes)`: its tokens, segment
ids and predictions (offsets relative to its own [CLS]), its NSP label, where it came from
(file and record index, for error messages) and where it goes (pack and position in the pack).

The plan (bert_packed.packing) says how many packs hold which lengths. Real sequences are
assigned to the plan's slots at random without holding them in memory: the j-th sequence of
length l (in reading order) takes slot perm_l(j) among the slots of length l, and pack g is
written at position perm(g), where the permutations are keyed pseudo-random bijections
(keyed_permutation). So packs are random mixtures, the packed data is in random order, and each
sequence is used exactly once.
"""

from __future__ import annotations

import numba
import numpy as np

from bert_packed.features import Shapes
from bert_packed.records import RecordError


def row_dtype(shapes: Shapes, max_token_id: int = 2**31 - 1) -> np.dtype:
    """One unpacked sequence, compact: predictions relative to the sequence, token ids as uint16
    when every id is below 2**16 (the BERT vocabularies but the multilingual one), else int32."""
    seq, pred = shapes.max_seq_length, shapes.max_predictions_per_seq
    ids = "<u2" if max_token_id < 2**16 else "<i4"
    positions = "<u2" if seq <= 2**16 else "<i4"
    return np.dtype([
        ("length", "<i4"), ("num_predictions", "<i4"), ("next_sentence_label", "<i4"),
        ("file", "<i4"), ("record", "<i8"), ("pack", "<i8"), ("position", "<i4"),
        ("input_ids", ids, (seq,)), ("segment_ids", "<i1", (seq,)),
        ("masked_lm_positions", positions, (pred,)), ("masked_lm_ids", ids, (pred,)),
    ])


@numba.njit(cache=True, nogil=True)
def _fill_rows(input_ids, input_mask, segment_ids, masked_positions, masked_ids, masked_weights, labels,
               out_length, out_predictions, out_label, out_ids, out_segments, out_masked_positions, out_masked_ids):
    """Copies each record's real tokens and predictions into its (zeroed) row."""
    for i in range(input_ids.shape[0]):
        length = 0
        for j in range(input_mask.shape[1]):
            length += input_mask[i, j] != 0
        count = 0
        for m in range(masked_weights.shape[1]):
            count += masked_weights[i, m] > 0
        out_length[i], out_predictions[i], out_label[i] = length, count, labels[i, 0]
        for j in range(length):
            out_ids[i, j] = input_ids[i, j]
            out_segments[i, j] = segment_ids[i, j]
        for m in range(count):
            out_masked_positions[i, m] = masked_positions[i, m]
            out_masked_ids[i, m] = masked_ids[i, m]


def rows_from_unpacked(batch: dict[str, np.ndarray], shapes: Shapes, file_index: int, first_record: int,
                       max_token_id: int = 2**31 - 1) -> np.ndarray:
    """Rows (row_dtype(shapes, max_token_id)) of a batch of parsed unpacked records
    (records.read_unpacked, which checks that masks and weights are ones then zeros, and ids in
    [0, 2**31))."""
    rows = np.zeros(len(batch["input_ids"]), dtype=row_dtype(shapes, max_token_id))
    _fill_rows(batch["input_ids"], batch["input_mask"], batch["segment_ids"], batch["masked_lm_positions"],
               batch["masked_lm_ids"], batch["masked_lm_weights"], batch["next_sentence_labels"],
               rows["length"], rows["num_predictions"], rows["next_sentence_label"], rows["input_ids"],
               rows["segment_ids"], rows["masked_lm_positions"], rows["masked_lm_ids"])
    rows["file"] = file_index
    rows["record"] = first_record + np.arange(len(rows))
    return rows


@numba.vectorize(["uint64(uint64)"], cache=True)
def _mix(value):
    """splitmix64's finaliser: a fast bijective scramble of uint64 values (a ufunc)."""
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))


_HASHED_FIELDS = ("length", "num_predictions", "next_sentence_label", "input_ids", "segment_ids",
                  "masked_lm_positions", "masked_lm_ids")


@numba.njit(cache=True, nogil=True)
def _add_linear_form(total, field, weights):
    """total[i] += field[i] . weights, mod 2**64 (int64 arithmetic wraps)."""
    for i in range(field.shape[0]):
        acc = np.int64(0)
        for j in range(field.shape[1]):
            acc += np.int64(field[i, j]) * weights[j]
        total[i] += acc


def sequence_hashes(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each sequence's content (tokens, segments, predictions, NSP label).

    A random linear form of the content (mod 2**64, one pass) scrambled by a non-linear mix, so
    that sums of hashes do not cancel when content moves between sequences. Provenance and
    destination (file, record, pack) are left out.
    """
    total = np.zeros(len(rows), dtype=np.int64)
    offset = 1
    for name in _HASHED_FIELDS:
        field = rows[name].reshape(len(rows), -1)
        weights = _mix(np.arange(offset, offset + field.shape[1], dtype=np.uint64)).view(np.int64)
        _add_linear_form(total, field, weights)
        offset += field.shape[1]
    return _mix(total.view(np.uint64))


def checksum(rows: np.ndarray) -> int:
    """Order-independent checksum of a set of sequences: the sum of their hashes mod 2**64."""
    return int(sequence_hashes(rows).sum(dtype=np.uint64)) if len(rows) else 0


def provenance_checksum(rows: np.ndarray) -> int:
    """Order-independent checksum of where a set of sequences came from: the sum of a hash of each
    one's (input file, record) mod 2**64. Two sets agree when they hold the same sequences of the
    inputs, each once (one sequence twice and another missing would need mixed ids to collide)."""
    if not len(rows):
        return 0
    ids = (rows["file"].astype(np.uint64) << np.uint64(40)) | rows["record"].astype(np.uint64)
    return int(_mix(ids).sum(dtype=np.uint64))


def combine_checksums(*values: int) -> int:
    return sum(values) % (1 << 64)


@numba.njit(cache=True, nogil=True)
def _keyed_permutation(indices, sizes, keys, out):
    one = np.uint64(1)
    for i in range(len(indices)):
        size = sizes[i]
        if size <= one:
            out[i] = 0
            continue
        bits = np.uint64(0)  # bit length of size - 1
        while (size - one) >> bits:
            bits += one
        half = (bits + one) // np.uint64(2)
        mask = (one << half) - one
        key = keys[i] * np.uint64(4)
        round_keys = (_mix(key), _mix(key + one), _mix(key + np.uint64(2)), _mix(key + np.uint64(3)))
        value = indices[i]
        while True:  # cycle-walk until the value lands inside [0, size)
            left, right = value >> half, value & mask
            for round_key in round_keys:
                left, right = right, left ^ (_mix(right ^ round_key) & mask)
            value = (left << half) | right
            if value < size:
                break
        out[i] = value


def keyed_permutation(indices: np.ndarray, size, key) -> np.ndarray:
    """A pseudo-random bijection of [0, size), evaluated at `indices`, with no table in memory.

    A 4-round Feistel network on the smallest even power of two >= size, cycle-walking values
    that land outside [0, size) (fewer than 4 walks on average). `size` and `key` may be arrays
    (one per index): each index is then permuted within its own domain.

    >>> sorted(keyed_permutation(np.arange(10), 10, key=7).tolist()) == list(range(10))
    True
    """
    indices = np.ascontiguousarray(indices, dtype=np.uint64)
    size = np.ascontiguousarray(np.broadcast_to(np.asarray(size, dtype=np.uint64), indices.shape))
    key = np.ascontiguousarray(np.broadcast_to(np.asarray(key, dtype=np.uint64), indices.shape))
    out = np.empty(indices.shape, dtype=np.int64)
    _keyed_permutation(indices, size, key, out)
    return out


class SlotTable:
    """Where each slot of the plan is: slot k of length l -> (pack g, position in the pack).

    Packs are numbered strategy by strategy; inside a strategy its lengths are in the plan's
    order (longest first), so a pack's sequence index of a slot is its position + 1. Slots of one
    length are numbered run by run, a run being one length's place in one strategy (count slots).
    """

    def __init__(self, strategies, max_sequence_length: int):
        self.num_packs = sum(count for _, count in strategies)
        first_pack = np.cumsum([0] + [count for _, count in strategies])
        runs = sorted((length, s, position) for s, (lengths, _) in enumerate(strategies)
                      for position, length in enumerate(lengths))
        run_length = np.array([r[0] for r in runs], dtype=np.int64)
        counts = np.array([strategies[r[1]][1] for r in runs], dtype=np.int64)
        # Slot number of each run's first slot among the slots of its length.
        run_start = np.cumsum(counts) - counts
        first_of_length = np.searchsorted(run_length, run_length)
        run_start -= run_start[first_of_length]
        self._stride = int(counts.sum()) + 1
        self._run_key = run_length * self._stride + run_start  # sorted
        self._run_start = run_start
        self._first_pack = first_pack[[r[1] for r in runs]].astype(np.int64)
        self._position = np.array([r[2] for r in runs], dtype=np.int64)

    def locate(self, lengths: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pack index, position in pack) of slot `slots[i]` among the slots of length `lengths[i]`.

        >>> table = SlotTable([((5, 3), 2), ((5,), 1)], 8)   # packs 0-1: (5, 3); pack 2: (5,)
        >>> [p.tolist() for p in table.locate(np.array([5, 5, 5, 3]), np.array([0, 1, 2, 1]))]
        [[0, 1, 2, 1], [0, 0, 0, 1]]
        """
        run = np.searchsorted(self._run_key, np.asarray(lengths) * self._stride + slots, side="right") - 1
        return self._first_pack[run] + (slots - self._run_start[run]), self._position[run]


@numba.njit(cache=True, nogil=True)
def _assemble(order, packs, lengths, predictions, labels, input_ids, segment_ids, masked_positions, masked_ids,
              out_ids, out_mask, out_segments, out_positions, out_masked_positions, out_masked_ids,
              out_masked_weights, out_next_positions, out_next_labels, out_next_weights):
    """Copies rows into packs, in `order` (by pack, then position); returns the first row that
    overflows its pack (-1 when none does)."""
    seq, pred, depth = out_ids.shape[1], out_masked_ids.shape[1], out_next_labels.shape[1]
    pack, token, prediction, index = -1, 0, 0, 0
    for r in order:
        if packs[r] != pack:
            pack, token, prediction, index = packs[r], 0, 0, 0
        length, count = lengths[r], predictions[r]
        if token + length > seq or prediction + count > pred or index >= depth:
            return r
        for j in range(length):
            out_ids[pack, token + j] = input_ids[r, j]
            out_segments[pack, token + j] = segment_ids[r, j]
            out_mask[pack, token + j] = index + 1
            out_positions[pack, token + j] = j
        for m in range(count):
            out_masked_positions[pack, prediction + m] = masked_positions[r, m] + token
            out_masked_ids[pack, prediction + m] = masked_ids[r, m]
            out_masked_weights[pack, prediction + m] = index + 1
        out_next_positions[pack, index] = token
        out_next_labels[pack, index] = labels[r]
        out_next_weights[pack, index] = 1
        token += length
        prediction += count
        index += 1
    return -1


def assemble_packs(rows: np.ndarray, pack_of_row: np.ndarray, position_of_row: np.ndarray, num_packs: int,
                   shapes: Shapes) -> dict[str, np.ndarray]:
    """Packed features (bert_packed.features) for `num_packs` packs from their member rows.

    Worked example (L = 8, S = 2): a 5-token and a 3-token sequence share pack 0.

    >>> shapes = Shapes(8, 2, 2)
    >>> rows = np.zeros(2, dtype=row_dtype(shapes))
    >>> rows["length"], rows["num_predictions"], rows["next_sentence_label"] = [5, 3], [1, 1], [0, 1]
    >>> rows["input_ids"][0, :5], rows["input_ids"][1, :3] = [101, 7, 8, 9, 102], [101, 5, 102]
    >>> rows["masked_lm_positions"][:, 0], rows["masked_lm_ids"][:, 0] = [2, 1], [42, 43]
    >>> packs = assemble_packs(rows, np.array([0, 0]), np.array([0, 1]), 1, shapes)
    >>> packs["input_ids"][0].tolist(), packs["input_mask"][0].tolist(), packs["positions"][0].tolist()
    ([101, 7, 8, 9, 102, 101, 5, 102], [1, 1, 1, 1, 1, 2, 2, 2], [0, 1, 2, 3, 4, 0, 1, 2])
    >>> packs["masked_lm_positions"][0].tolist(), packs["masked_lm_weights"][0].tolist()
    ([2, 6, 0, 0], [1, 2, 0, 0])
    >>> packs["next_sentence_positions"][0].tolist(), packs["next_sentence_labels"][0].tolist()
    ([0, 5], [0, 1])

    Args:
      rows: member sequences (row_dtype).
      pack_of_row: int [n], the pack (0..num_packs-1) of each row.
      position_of_row: int [n], its place in the pack (0..S-1); a pack's rows sit in that order.
      num_packs: packs to build.
      shapes: L, P and S; predictions per pack are P' = P + S.

    Returns:
      {feature: int32 array [num_packs, length]}.

    Raises:
      RecordError: a pack would exceed L tokens, P' predictions or S sequences.
    """
    seq, pred, depth = shapes.max_seq_length, shapes.max_predictions_per_pack, shapes.max_sequences_per_pack
    packs = np.asarray(pack_of_row, dtype=np.int64)
    order = np.lexsort((position_of_row, packs))
    out = {name: np.zeros((num_packs, length), dtype=np.int32) for name, length in shapes.packed_lengths().items()}
    bad = _assemble(order, packs, rows["length"], rows["num_predictions"], rows["next_sentence_label"],
                    rows["input_ids"], rows["segment_ids"], rows["masked_lm_positions"], rows["masked_lm_ids"],
                    *out.values())
    if bad >= 0:
        raise RecordError(f"pack {packs[bad]} overflows: more than {seq} tokens, {pred} predictions or {depth} "
                         f"sequences (its sequence from input file {rows['file'][bad]}, record {rows['record'][bad]})")
    return out


@numba.njit(cache=True, nogil=True)
def _unpack(row_of_cell, input_ids, input_mask, segment_ids, masked_positions, masked_ids, masked_weights,
            next_positions, lengths, predictions, out_ids, out_segments, out_masked_positions, out_masked_ids):
    """Copies every pack's sequences out; returns the first pack that does not decode (-1: none)."""
    depth, width = row_of_cell.shape[1], out_masked_ids.shape[1]
    for pack in range(input_ids.shape[0]):
        for t in range(input_ids.shape[1]):
            k = input_mask[pack, t]
            if k == 0:
                continue
            if k > depth or row_of_cell[pack, k - 1] < 0:
                return pack
            row = row_of_cell[pack, k - 1]
            out_ids[row, lengths[row]] = input_ids[pack, t]
            out_segments[row, lengths[row]] = segment_ids[pack, t]
            lengths[row] += 1
        for m in range(masked_ids.shape[1]):
            k = masked_weights[pack, m]
            if k == 0:
                continue
            if k > depth or row_of_cell[pack, k - 1] < 0 or predictions[row_of_cell[pack, k - 1]] >= width:
                return pack
            row = row_of_cell[pack, k - 1]
            out_masked_positions[row, predictions[row]] = masked_positions[pack, m] - next_positions[pack, k - 1]
            out_masked_ids[row, predictions[row]] = masked_ids[pack, m]
            predictions[row] += 1
    return -1


def unpack(packs: dict[str, np.ndarray], shapes: Shapes) -> np.ndarray:
    """The sequences inside packed features, as rows (provenance fields zero).

    The inverse of assemble_packs: used to checksum what was written and by --verify. A pack's
    sequence k (1-based) is where input_mask == k, its predictions where masked_lm_weights == k.

    Raises:
      RecordError: a pack refers to a sequence it does not have, or one sequence has more than P
        predictions.
    """
    weights = packs["next_sentence_weights"]
    pack_index, index_in_pack = np.nonzero(weights)
    rows = np.zeros(len(pack_index), dtype=row_dtype(shapes))
    row_of_cell = np.full(weights.shape, -1, dtype=np.int64)
    row_of_cell[pack_index, index_in_pack] = np.arange(len(rows))
    bad = _unpack(row_of_cell, packs["input_ids"], packs["input_mask"], packs["segment_ids"],
                  packs["masked_lm_positions"], packs["masked_lm_ids"], packs["masked_lm_weights"],
                  packs["next_sentence_positions"], rows["length"], rows["num_predictions"], rows["input_ids"],
                  rows["segment_ids"], rows["masked_lm_positions"], rows["masked_lm_ids"])
    if bad >= 0:
        raise RecordError(f"pack {bad} does not decode: a token or prediction belongs to no sequence of the pack, "
                         f"or a sequence has more than {shapes.max_predictions_per_seq} predictions")
    rows["next_sentence_label"] = packs["next_sentence_labels"][pack_index, index_in_pack]
    return rows
