"""Packing on the fly: a stream of sequences in random order, packed within a bounded window.

The offline planner (bert_packed.packing.plan) packs a whole length histogram at once. A training
input pipeline that reads shuffled records sees one sequence at a time and cannot hold the
dataset; OnlinePacker packs such a stream holding at most `window` sequences, guided by a plan
made offline on the dataset's histogram:

- A sequence of exactly L tokens is a pack by itself, at once.
- Templates: each strategy (lengths, count) of the plan is a template, a pack of sequences of
  exactly those lengths. Sequences wait in one first-in-first-out queue per length. When a
  sequence arrives, the templates with a slot of its length are tried: a template whose other
  slots can all be filled from the queues makes a pack at once, taking the oldest waiting
  sequence of each length.
- Quotas: after n sequences the plan expects n * count / (sequences in the plan) packs of a
  template. Of the templates that can be filled, the one furthest behind its share is used; one
  that has had its share is not (the sequence waits instead). Without the quota, templates whose
  partners are common get filled first and take the sequences that others need: on 2M
  Wikipedia-512 sequences (window 20,000), 99.83% instead of 99.88% efficient, and 81% instead
  of 99.76% with NNLSHP's plan. Allowing a template a few packs ahead of its share held fewer
  sequences but was never more efficient.
- Eviction: when `window` sequences wait and the next one cannot be packed, the oldest waiting
  sequence leaves at once, in a pack completed by best fit: the one or two waiting sequences
  that fill most of its free space (of equal fills, two), while it has room and fewer than S.
- Flush, at the end of a stream: the longest waiting sequence is completed the same way, until
  none waits.

The plan's strategies hold real lengths (a slot the planner gave a shorter sequence appears as a
strategy of its own), so templates match lengths exactly. The packer follows its plan: give it
the `lp` plan of the stream's own histogram. On the real Wikipedia-512 stream, the plan of the
Wikipedia-like histogram packs 98.1% efficient, LPFHP's plan 89.5% (its own efficiency), and a
plan none of whose templates ever fits (eviction alone) 98.9%.

On the real Wikipedia-512 histogram at depth 3 (offline LP: 99.884% efficient), the whole
dataset (16.3M sequences) in random order packs 99.884% efficient with a window of 30,000 (the
training default, bert_packed.training.config; 99.877% with 20,000; 99.77% with 1,000), where
online best fit over all open packs reaches 96.0%; the packer decides about 7 million sequences
a second (scripts/benchmark_online_packing.py).
"""

from __future__ import annotations

import numba
import numpy as np

from bert_packed.errors import SettingsError

# Rows of the pool's cell table: one cell per waiting sequence.
_ID, _LENGTH, _NEXT, _NEWER, _OLDER = range(5)
# Rows of the per-length queue table.
_HEAD, _TAIL, _COUNT = range(3)
# Entries of the state vector.
_HELD, _OLDEST, _NEWEST, _PEAK = range(4)


@numba.njit(cache=True, nogil=True)
def _highest_at_most(bits, value):
    """The longest waiting length <= value (0 when there is none): a bit per length."""
    if value <= 0:
        return 0
    word_index = value >> 6
    word = bits[word_index] & ((np.uint64(2) << np.uint64(value & 63)) - np.uint64(1))
    while word == 0:
        word_index -= 1
        if word_index < 0:
            return 0
        word = bits[word_index]
    bit = 0
    for shift in (32, 16, 8, 4, 2, 1):
        if word >> np.uint64(shift):
            word >>= np.uint64(shift)
            bit += shift
    return word_index * 64 + bit


@numba.njit(cache=True, nogil=True)
def _push(cells, queues, bits, free, state, sequence, length):
    """Puts a sequence at the end of its length's queue and of the age list."""
    cell = free[state[_HELD]]
    state[_HELD] += 1
    state[_PEAK] = max(state[_PEAK], state[_HELD])
    cells[_ID, cell], cells[_LENGTH, cell], cells[_NEXT, cell] = sequence, length, -1
    if queues[_COUNT, length] == 0:
        queues[_HEAD, length] = cell
        bits[length >> 6] |= np.uint64(1) << np.uint64(length & 63)
    else:
        cells[_NEXT, queues[_TAIL, length]] = cell
    queues[_TAIL, length] = cell
    queues[_COUNT, length] += 1
    cells[_OLDER, cell], cells[_NEWER, cell] = state[_NEWEST], -1
    if state[_NEWEST] >= 0:
        cells[_NEWER, state[_NEWEST]] = cell
    else:
        state[_OLDEST] = cell
    state[_NEWEST] = cell


@numba.njit(cache=True, nogil=True)
def _pop(cells, queues, bits, free, state, length):
    """Takes the oldest waiting sequence of `length` out of the pool; returns its id."""
    cell = queues[_HEAD, length]
    queues[_HEAD, length] = cells[_NEXT, cell]
    queues[_COUNT, length] -= 1
    if queues[_COUNT, length] == 0:
        bits[length >> 6] &= ~(np.uint64(1) << np.uint64(length & 63))
    older, newer = cells[_OLDER, cell], cells[_NEWER, cell]
    if older >= 0:
        cells[_NEWER, older] = newer
    else:
        state[_OLDEST] = newer
    if newer >= 0:
        cells[_OLDER, newer] = older
    else:
        state[_NEWEST] = older
    state[_HELD] -= 1
    free[state[_HELD]] = cell
    return cells[_ID, cell]


@numba.njit(cache=True, nogil=True)
def _best_pair(queues, bits, space, slots):
    """The waiting lengths, one or (with `slots` >= 2) two, that fill the most of `space`; of
    equal fills, two sequences rather than one, since depth is what the packs of a stream's
    leftovers run short of. Returns (longer, shorter), 0 for none."""
    best, best_items, best_first, best_second = 0, 0, 0, 0
    first = _highest_at_most(bits, space)
    while first > 0 and 2 * first >= best:
        second = 0
        if slots >= 2:
            second = _highest_at_most(bits, min(space - first, first))
            if second == first and queues[_COUNT, first] < 2:
                second = _highest_at_most(bits, first - 1)
        items = 2 if second > 0 else 1
        if first + second > best or (first + second == best and items > best_items):
            best, best_items, best_first, best_second = first + second, items, first, second
            if best == space and (items == 2 or slots == 1):
                break
        if slots == 1:
            break
        first = _highest_at_most(bits, first - 1)
    return best_first, best_second


@numba.njit(cache=True, nogil=True)
def _complete(cells, queues, bits, free, state, out, row, sequence, length, max_length):
    """Writes a pack holding `sequence` (already out of the pool) and waiting sequences that
    fill it best, one or two at a time, longest first."""
    depth = out.shape[1]
    out[row, :] = -1
    out[row, 0] = sequence
    order = np.empty(depth, np.int64)
    order[0] = length
    items, space = 1, max_length - length
    while items < depth and space > 0:
        first, second = _best_pair(queues, bits, space, depth - items)
        if first == 0:
            break
        for part in (first, second):
            if part > 0:
                out[row, items], order[items] = _pop(cells, queues, bits, free, state, part), part
                items += 1
                space -= part
    for i in range(1, items):
        j = i
        while j > 0 and order[j] > order[j - 1]:
            order[j], order[j - 1] = order[j - 1], order[j]
            out[row, j], out[row, j - 1] = out[row, j - 1], out[row, j]
            j -= 1


@numba.njit(cache=True, nogil=True)
def _fill_template(cells, queues, bits, free, state, slots, share, used, first_candidate, candidates,
                   out, row, sequence, length):
    """Makes a pack of the best template with a slot of `length` whose other slots the queues
    can fill (see the module docstring); returns whether it did."""
    expected = sequence + 1.0
    best, best_slot, best_deficit = -1, -1, -np.inf
    for c in range(first_candidate[length], first_candidate[length + 1]):
        template, slot = candidates[0, c], candidates[1, c]
        deficit = share[template] * expected - used[template]
        if deficit < 0.0 or deficit <= best_deficit:
            continue
        fits, previous, need = True, 0, 0
        for j in range(slots.shape[1]):
            part = slots[template, j]
            if j == slot or part == 0:
                continue
            need = need + 1 if part == previous else 1
            previous = part
            if queues[_COUNT, part] < need:
                fits = False
                break
        if fits:
            best, best_slot, best_deficit = template, slot, deficit
    if best < 0:
        return False
    used[best] += 1.0
    out[row, :] = -1
    for j in range(slots.shape[1]):
        part = slots[best, j]
        if j == best_slot:
            out[row, j] = sequence
        elif part > 0:
            out[row, j] = _pop(cells, queues, bits, free, state, part)
    return True


@numba.njit(cache=True, nogil=True)
def _add(lengths, first_id, cells, queues, bits, free, state, slots, share, used, first_candidate, candidates,
         out, max_length):
    """Packs or queues each arriving sequence; returns the number of packs written to `out`."""
    window = cells.shape[1]
    rows = 0
    for i in range(lengths.shape[0]):
        sequence, length = first_id + i, lengths[i]
        if length == max_length:
            out[rows, :] = -1
            out[rows, 0] = sequence
            rows += 1
        elif _fill_template(cells, queues, bits, free, state, slots, share, used, first_candidate, candidates,
                            out, rows, sequence, length):
            rows += 1
        else:
            if state[_HELD] == window:
                # The oldest of all is the oldest of its length: the head of that queue.
                oldest = state[_OLDEST]
                evicted_length = cells[_LENGTH, oldest]
                evicted = _pop(cells, queues, bits, free, state, evicted_length)
                _complete(cells, queues, bits, free, state, out, rows, evicted, evicted_length, max_length)
                rows += 1
            _push(cells, queues, bits, free, state, sequence, length)
    return rows


@numba.njit(cache=True, nogil=True)
def _flush(cells, queues, bits, free, state, out, max_length):
    """Packs every waiting sequence, the longest first; returns the number of packs."""
    rows = 0
    while state[_HELD] > 0:
        length = _highest_at_most(bits, max_length)
        sequence = _pop(cells, queues, bits, free, state, length)
        _complete(cells, queues, bits, free, state, out, rows, sequence, length, max_length)
        rows += 1
    return rows


class OnlinePacker:
    """Packs a stream of sequences on the fly, guided by a plan, holding at most `window` of them.

    Sequences are numbered in the order they are added (0, 1, 2, ..., across calls). add()
    returns the packs it could decide; flush() packs the rest at the end of a stream (an epoch, an
    evaluation set). A pack is a row of sequence ids, longest sequence first, -1 in unused cells.
    The packs depend only on the order of the lengths, not on how they are split into add()
    calls: the caller shuffles, the packer draws nothing at random.

    Worked example (L = 8, depth 2): a plan of two (6, 2) packs and one (5, 3) pack.

    >>> packer = OnlinePacker([((6, 2), 2), ((5, 3), 1)], max_seq_length=8, max_sequences_per_pack=2,
    ...                       window=2)
    >>> packer.add(np.array([6, 5, 8, 2, 3, 4, 2, 7])).tolist()
    [[2, -1], [0, 3], [1, 4], [5, 6]]
    >>> packer.held, packer.flush().tolist(), packer.held
    (1, [[7, -1]], 0)

    The 8 (sequence 2) is a pack by itself. The 6 and the 5 wait; the first 2 completes a (6, 2)
    template with the 6, the 3 a (5, 3) with the 5. The 4 and the last 2 find no template and
    wait. Then the window is full: the 7 fits no template either, so the oldest waiting sequence,
    the 4, leaves with the best fit among the others, the 2, and the 7 waits for the flush.

    Args:
      strategies: a PackingPlan's strategies, ((lengths, count), ...): `count` packs of sequences
        of exactly `lengths`; the plan made for the stream's length histogram.
      max_seq_length: L, the tokens of a pack.
      max_sequences_per_pack: S, the most sequences in a pack.
      window: the most sequences held (added and not yet returned in a pack): each sequence is
        decided as it arrives, and after each at most `window` wait.

    Raises:
      SettingsError: L, S or the window not an integer >= 1, a window below S, a strategy that
        does not fit L or S, or no strategies.
    """

    def __init__(self, strategies, max_seq_length: int, max_sequences_per_pack: int, window: int):
        for name, value in (("max_seq_length", max_seq_length), ("max_sequences_per_pack", max_sequences_per_pack),
                            ("--online_packing_window", window)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise SettingsError(f"{name} must be an integer >= 1, got {value!r}")
        max_length, depth, window = int(max_seq_length), int(max_sequences_per_pack), int(window)
        if window < depth:
            raise SettingsError(f"--online_packing_window={window} is too small: a pack of max_sequences_per_pack="
                                f"{depth} sequences needs at least {depth} held at once")
        templates = [(tuple(sorted((int(x) for x in lengths), reverse=True)), int(count)) for lengths, count in strategies]
        if not templates:
            raise SettingsError("the packing plan has no strategies")
        for lengths, count in templates:
            if count < 1 or not lengths or len(lengths) > depth or min(lengths) < 1 or sum(lengths) > max_length:
                raise SettingsError(f"packing strategy {lengths} x {count} does not fit max_seq_length={max_length} "
                                    f"and max_sequences_per_pack={depth} (a plan made for other settings?)")
        plan_sequences = sum(len(lengths) * count for lengths, count in templates)
        self._max_length, self._depth, self._window = max_length, depth, window
        self._packing_factor = plan_sequences / sum(count for _, count in templates)

        self._slots = np.zeros((len(templates), depth), dtype=np.int64)
        for t, (lengths, _) in enumerate(templates):
            self._slots[t, :len(lengths)] = lengths
        self._share = np.array([count / plan_sequences for _, count in templates])
        self._used = np.zeros(len(templates))
        # (template, slot) for each length, by length. An arriving sequence takes the last slot of
        # its length, after the waiting ones (older first).
        pairs = sorted({(length, t, len(lengths) - 1 - lengths[::-1].index(length))
                        for t, (lengths, _) in enumerate(templates) for length in lengths})
        self._candidates = np.array([[t for _, t, _ in pairs], [s for _, _, s in pairs]], dtype=np.int64)
        self._first_candidate = np.searchsorted(np.array([length for length, _, _ in pairs], dtype=np.int64),
                                                np.arange(max_length + 2)).astype(np.int64)

        self._cells = np.zeros((5, window), dtype=np.int64)
        self._queues = np.zeros((3, max_length + 1), dtype=np.int64)
        self._bits = np.zeros(max_length // 64 + 1, dtype=np.uint64)
        self._free = np.arange(window, dtype=np.int64)
        self._state = np.array([0, -1, -1, 0], dtype=np.int64)
        self._next_id = 0

    @property
    def max_sequence_length(self) -> int:
        """L, the tokens of a pack."""
        return self._max_length

    @property
    def max_sequences_per_pack(self) -> int:
        """S, the most sequences in a pack."""
        return self._depth

    @property
    def window(self) -> int:
        """The most sequences held at any time."""
        return self._window

    @property
    def predicted_packing_factor(self) -> float:
        """The plan's sequences per pack: what a long stream packs to."""
        return self._packing_factor

    @property
    def held(self) -> int:
        """Sequences added and not yet returned in a pack."""
        return int(self._state[_HELD])

    @property
    def peak_held(self) -> int:
        """The most sequences held at once so far (at most `window`)."""
        return int(self._state[_PEAK])

    def add(self, lengths: np.ndarray) -> np.ndarray:
        """Adds sequences to the stream; returns the packs now decided.

        Args:
          lengths: int array [n], each in [1, L]: the next n sequences' lengths. They get the ids
            that follow the last sequence added.

        Returns:
          int64 array [K, S]: each row the ids of one pack's sequences, longest first, -1 in unused
          cells. Every id appears in exactly one pack of one add() or flush() result.

        Raises:
          SettingsError: a length is not an integer in [1, L]; nothing is added then.
        """
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
            raise SettingsError(f"sequence lengths must be a 1-D integer array, got {lengths.dtype} "
                                f"of shape {lengths.shape}")
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        if lengths.size and lengths.max() > self._max_length:
            raise SettingsError(f"a sequence of {lengths.max()} tokens does not fit max_seq_length {self._max_length}")
        if lengths.size and lengths.min() < 1:
            raise SettingsError(f"a sequence of {lengths.min()} tokens: every sequence has at least 1 token")
        out = np.empty((len(lengths), self._depth), dtype=np.int64)  # one pack at most per arrival
        rows = _add(lengths, self._next_id, self._cells, self._queues, self._bits, self._free, self._state,
                    self._slots, self._share, self._used, self._first_candidate, self._candidates, out,
                    self._max_length)
        self._next_id += len(lengths)
        return out[:rows].copy()

    def flush(self) -> np.ndarray:
        """Packs every sequence still held (the end of a stream); the packer can go on afterwards.

        Returns:
          int64 array [K, S], as add() returns.
        """
        out = np.empty((self.held, self._depth), dtype=np.int64)
        rows = _flush(self._cells, self._queues, self._bits, self._free, self._state, out, self._max_length)
        return out[:rows]
