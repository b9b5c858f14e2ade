"""Feature names and shapes of the unpacked (MLPerf) and packed record formats (DESIGN.md).

Shapes: L = max_seq_length, P = max_predictions_per_seq, S = max_sequences_per_pack,
P' = P + S (a pack's prediction slots: each sequence rounds its share up by at most one).

Unpacked: input_ids[L], input_mask[L] (1 real, 0 pad), segment_ids[L], masked_lm_positions[P],
masked_lm_ids[P], masked_lm_weights[P] (float 1.0 real, 0.0 pad), next_sentence_labels[1].

Packed: input_ids[L], input_mask[L] (sequence index 1..S, 0 pad), segment_ids[L], positions[L]
(restarting at 0 per sequence), masked_lm_positions[P'] (offsets into the pack), masked_lm_ids[P'],
masked_lm_weights[P'] (sequence index of each prediction, 0 none), next_sentence_positions[S]
(offset of each sequence's [CLS]), next_sentence_labels[S], next_sentence_weights[S] (1 where a
sequence exists).
"""

from __future__ import annotations

import dataclasses

UNPACKED_FLOAT_FEATURES = ("masked_lm_weights",)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The fixed sizes of one dataset's records.

    Attributes:
      max_seq_length: L.
      max_predictions_per_seq: P, predictions of one unpacked sequence.
      max_sequences_per_pack: S (1 for unpacked data).
    """

    max_seq_length: int
    max_predictions_per_seq: int
    max_sequences_per_pack: int = 1

    @property
    def max_predictions_per_pack(self) -> int:
        """P' = P + S for packs; P for unpacked records."""
        if self.max_sequences_per_pack == 1:
            return self.max_predictions_per_seq
        return self.max_predictions_per_seq + self.max_sequences_per_pack

    def unpacked(self) -> "Shapes":
        """The shapes of the unpacked records these packs are made of (S = 1)."""
        return Shapes(self.max_seq_length, self.max_predictions_per_seq)

    def unpacked_lengths(self) -> dict[str, int]:
        """Feature name -> length in an unpacked record."""
        seq, pred = self.max_seq_length, self.max_predictions_per_seq
        return {"input_ids": seq, "input_mask": seq, "segment_ids": seq, "masked_lm_positions": pred,
                "masked_lm_ids": pred, "masked_lm_weights": pred, "next_sentence_labels": 1}

    def packed_lengths(self) -> dict[str, int]:
        """Feature name -> length in a packed record (and in the model's feature dict)."""
        seq, pred, packs = self.max_seq_length, self.max_predictions_per_pack, self.max_sequences_per_pack
        return {"input_ids": seq, "input_mask": seq, "segment_ids": seq, "positions": seq,
                "masked_lm_positions": pred, "masked_lm_ids": pred, "masked_lm_weights": pred,
                "next_sentence_positions": packs, "next_sentence_labels": packs,
                "next_sentence_weights": packs}
