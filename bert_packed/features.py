"""The one place where record features are spelled: keys, dtypes and lengths, unpacked and packed.

Shapes: L = max_seq_length, P = max_predictions_per_seq, S = max_sequences_per_pack,
P' = P + S (a pack's prediction slots: each sequence rounds its share up by at most one).
docs/data_formats.md describes both layouts in full.

Unpacked records (the MLPerf reference schema; int64 on disk, masked_lm_weights float32):

  key                    length  meaning
  input_ids              L       token ids, [CLS] A [SEP] B [SEP], then 0
  input_mask             L       1 for a real token, 0 for padding
  segment_ids            L       0 for [CLS] A [SEP], 1 for B [SEP]
  masked_lm_positions    P       offsets of the predicted tokens, then 0
  masked_lm_ids          P       the original ids at those offsets, then 0
  masked_lm_weights      P       1.0 for a real prediction, 0.0 for padding
  next_sentence_labels   1       1 when B is a random segment

Packed records keep Graphcore's public packed-TFRecord key names, which users' existing packed
data uses. Keys shared with the unpacked layout change meaning where a pack needs it:

  key                      length  meaning in a pack (and how it differs from unpacked)
  input_ids                L       the sequences' tokens one after another, then 0
  input_mask               L       the sequence index of each token, 1..S; 0 for padding
                                   (unpacked: 1 for every real token)
  segment_ids              L       each sequence's own segment ids
  positions                L       position ids restarting at 0 for each sequence (packed only)
  masked_lm_positions      P'      offsets into the pack (unpacked: into the sequence)
  masked_lm_ids            P'      the original ids at those offsets
  masked_lm_weights        P'      the sequence index of each prediction, 0 for none
                                   (unpacked: a float 1.0/0.0)
  next_sentence_positions  S       offset of each sequence's [CLS] (packed only)
  next_sentence_labels     S       each sequence's NSP label (unpacked: one label)
  next_sentence_weights    S       1 where a sequence exists (packed only)

Every packed key is int64 on disk. The input pipeline parses both layouts into the packed one
(int32), an unpacked record becoming a pack of one sequence.

The model's feature dict (what the input pipeline yields in every mode, and what the model, the
losses and the update read) holds the packed layout under the packed keys, except two renamed
for what they hold once parsed (MODEL_KEYS; model_features renames, record_features undoes it):

  model key                record key          length  meaning
  sequence_ids             input_mask          L       the sequence index of each token, 1..S; 0 for padding
  prediction_sequence_ids  masked_lm_weights   P'      the sequence index of each prediction, 0 for none

Records keep their names on disk (users' packed data and the MLPerf tools use them); only the
dict the model reads is renamed.

Fine-tuning rows (bert_packed.finetuning; built in memory from a task's files) hold sequences as
packs do, under the model's keys, and a classifier's slot for each sequence:

  key              length  meaning
  input_ids        L       the sequences' tokens one after another, then 0
  sequence_ids     L       the sequence index of each token, 1..S; 0 for padding
  segment_ids      L       each sequence's own segment ids
  positions        L       position ids restarting at 0 for each sequence
  cls_positions    S       offset of each sequence's [CLS]
  labels           S       its label: the class's index, or a regression's score (float32)
  label_weights    S       1 where a sequence is, 0 for an empty slot
  example_ids      S       the example's index in its file (0 for an empty slot)

A span task's rows (SQuAD: a question and a window of its context a sequence) hold, in place of
labels, where the answer is in each sequence (0, its [CLS], when the window does not hold it):

  start_positions  S       the answer's first token, counted from the sequence's [CLS]
  end_positions    S       its last token, likewise
  example_ids      S       the window's index among the file's windows

One example a row is the same layout with S = 1.
"""

from __future__ import annotations

import dataclasses

# Unpacked records hold this one feature as a FloatList; every other feature is an Int64List.
UNPACKED_FLOAT_FEATURES = ("masked_lm_weights",)

# Packed record key -> the model's key, where they differ: in a pack these two hold sequence
# indices, which their record names (a 0/1 mask, float weights) would have a reader misread.
MODEL_KEYS = {"input_mask": "sequence_ids", "masked_lm_weights": "prediction_sequence_ids"}


# How training data is read (bert_packed.training.input_pipeline's modes): packs from packed records, unpacked
# records one a row (padded), grouped by length (bucketed), packed as they are read, or packed
# records' sequences one a row (packs_as_rows: the update composition of packs, without packing).
INPUT_MODES = ("packed", "padded", "bucketed", "packed_online", "packs_as_rows")
# The modes whose rows hold several sequences (--train_batch_size counts packs; the packing factor
# corrects the batch and the betas).
PACK_MODES = ("packed", "packed_online", "packs_as_rows")
# The modes that read packed records (packed_online reads unpacked ones and packs them).
PACKED_RECORD_MODES = ("packed", "packs_as_rows")
# How eval data is read: as its records are, or unpacked records packed as they are read.
EVAL_INPUT_MODES = ("padded", "packed", "packed_online")

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

    def unpacked(self) -> Shapes:
        """The shapes of the unpacked records these packs are made of (S = 1)."""
        return Shapes(self.max_seq_length, self.max_predictions_per_seq)

    def unpacked_lengths(self) -> dict[str, int]:
        """Feature name -> length in an unpacked record."""
        seq, pred = self.max_seq_length, self.max_predictions_per_seq
        return {"input_ids": seq, "input_mask": seq, "segment_ids": seq, "masked_lm_positions": pred,
                "masked_lm_ids": pred, "masked_lm_weights": pred, "next_sentence_labels": 1}

    def packed_lengths(self) -> dict[str, int]:
        """Feature name -> length in a packed record (model_lengths: the same under the model's keys)."""
        seq, pred, packs = self.max_seq_length, self.max_predictions_per_pack, self.max_sequences_per_pack
        return {"input_ids": seq, "input_mask": seq, "segment_ids": seq, "positions": seq,
                "masked_lm_positions": pred, "masked_lm_ids": pred, "masked_lm_weights": pred,
                "next_sentence_positions": packs, "next_sentence_labels": packs,
                "next_sentence_weights": packs}

    def record_lengths(self, packed: bool) -> dict[str, int]:
        """Feature name -> length in a record of either layout."""
        return self.packed_lengths() if packed else self.unpacked_lengths()

    def model_lengths(self) -> dict[str, int]:
        """Feature name -> length in the model's feature dict (what the input pipeline yields)."""
        return model_features(self.packed_lengths())


# What a fine-tuning row says of each of its sequences, beside where it is (module docstring):
# a classifier's label, or a span's first and last token.
CLASSIFIER_TARGETS, SPAN_TARGETS = ("labels",), ("start_positions", "end_positions")


def finetuning_lengths(max_seq_length: int, max_sequences_per_pack: int,
                       targets: tuple[str, ...] = CLASSIFIER_TARGETS) -> dict[str, int]:
    """Feature name -> length in a fine-tuning row (module docstring), with `targets` (CLASSIFIER_TARGETS
    or SPAN_TARGETS) one a slot."""
    seq, slots = max_seq_length, max_sequences_per_pack
    return {"input_ids": seq, "sequence_ids": seq, "segment_ids": seq, "positions": seq, "cls_positions": slots,
            **dict.fromkeys(targets, slots), "label_weights": slots, "example_ids": slots}


def model_features(packed: dict) -> dict:
    """A dict of the packed record layout (values or lengths) under the model's keys.

    >>> sorted(model_features({"input_ids": 1, "input_mask": 2, "masked_lm_weights": 3}).items())
    [('input_ids', 1), ('prediction_sequence_ids', 3), ('sequence_ids', 2)]

    Args:
      packed: {packed record key: value}, e.g. parsed packed records or Shapes.packed_lengths().

    Returns:
      The same values, input_mask and masked_lm_weights under MODEL_KEYS' names.
    """
    return {MODEL_KEYS.get(name, name): value for name, value in packed.items()}


def record_features(features: dict) -> dict:
    """The inverse of model_features: the model's feature dict under the packed record keys.

    For code that works on packs as records, e.g. packer.unpack decoding what the pipeline yields.

    Args:
      features: {model key: value}.

    Returns:
      The same values, sequence_ids and prediction_sequence_ids under their record names.
    """
    record_keys = {model: record for record, model in MODEL_KEYS.items()}
    return {record_keys.get(name, name): value for name, value in features.items()}


def float_features(packed: bool) -> tuple[str, ...]:
    """The features stored as FloatList in a record of either layout."""
    return () if packed else UNPACKED_FLOAT_FEATURES


def tf_feature_spec(lengths: dict[str, int], float_names: tuple[str, ...] = ()) -> dict:
    """The tf.io.parse_example spec of records with these features.

    Args:
      lengths: feature name -> length (Shapes.record_lengths).
      float_names: the features stored as FloatList (float_features).

    Returns:
      {name: tf.io.FixedLenFeature([length], tf.float32 or tf.int64)}.
    """
    import tensorflow as tf  # only the callers that parse with TensorFlow pay for its import

    return {name: tf.io.FixedLenFeature([length], tf.float32 if name in float_names else tf.int64)
            for name, length in lengths.items()}
