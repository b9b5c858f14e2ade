"""The fine-tuning models: a task's head on a BertEncoder (keras-hub's backbone + task), called on
bert_packed.features' fine-tuning rows, several sequences a row.

Shape legend: B batch, L max_seq_length, H hidden_size, S sequences per row, C outputs.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from bert_packed.model.config import BertConfig
from bert_packed.model.modeling import BertEncoder, dropout, fold_seed, initializer


class BertClassifierModel(keras.Model):
    """BERT fine-tuned to classify (or score) each sequence of a row: google-research's
    run_classifier head on each sequence's own [CLS].

    Its encoder (`encoder`, with the pooler, google-research's bert/pooler) starts from any
    pre-trained weights a BertEncoder loads (model.load_weights); the model holds no pre-training
    head. On the pooled [CLS]: dropout at hidden_dropout_prob, then `classifier`
    (google-research's output_weights and output_bias).

    Inputs (int32): BertEncoder's, and cls_positions [B, S] (bert_packed.features' fine-tuning
    rows). Other keys are ignored.

    Args:
      config: the BERT hyper-parameters.
      num_outputs: the classes' logits, or 1 for a regression's score.
      recompute: as BertEncoder's.

    Returns:
      {"logits": float32 [B, S, num_outputs]}.
    """

    def __init__(self, config: BertConfig, num_outputs: int, recompute: str = "none", **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.num_outputs = num_outputs
        self.recompute = recompute
        self.encoder = BertEncoder(config, with_pooler=True, recompute=recompute, name="encoder")
        self.classifier = keras.layers.Dense(num_outputs, kernel_initializer=initializer(config.initializer_range),
                                             name="classifier")

    def build(self, input_shape=None):
        self.encoder.build()
        self.classifier.build([None, None, self.config.hidden_size])
        self.built = True

    def call(self, features, training=False, dropout_seed=None):
        if training and dropout_seed is None:
            dropout_seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
        sequence_output = self.encoder(features, training=training, dropout_seed=dropout_seed)  # [B, L, H]
        pooled = self.encoder.pool(sequence_output, features["cls_positions"])                  # [B, S, H]
        if training:  # the encoder's layers take seeds 0..num_hidden_layers
            pooled = dropout(pooled, self.config.hidden_dropout_prob,
                             fold_seed(dropout_seed, self.config.num_hidden_layers + 1))
        return {"logits": tf.cast(self.classifier(pooled), tf.float32)}                         # [B, S, C]

    def get_config(self):
        return {"config": self.config.to_dict(), "num_outputs": self.num_outputs, "recompute": self.recompute}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig(**config["config"]), config["num_outputs"], config.get("recompute", "none"))


# A span logit at a position outside the sequence: its softmax there is 0 (exp underflows).
OUTSIDE_THE_SEQUENCE = -1e9


class BertQuestionAnsweringModel(keras.Model):
    """BERT fine-tuned to find an answer's span in each sequence of a row: google-research's
    run_squad head (a start and an end logit a token), read sequence by sequence.

    Each sequence's logits are gathered from its own tokens, position 0 at its [CLS], and every
    position past its end holds OUTSIDE_THE_SEQUENCE: a softmax over them is the sequence's alone,
    so a sequence gets the same span probabilities wherever it sits in a pack, and alone in a
    padded row. The encoder (`encoder`) has no pooler, as run_squad reads none; `qa_outputs` is
    google-research's cls/squad output_weights and output_bias.

    Inputs (int32): BertEncoder's, and cls_positions [B, S].

    Args:
      config: the BERT hyper-parameters.
      recompute: as BertEncoder's.

    Returns:
      {"start_logits", "end_logits": float32 [B, S, L]}.
    """

    def __init__(self, config: BertConfig, recompute: str = "none", **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.recompute = recompute
        self.encoder = BertEncoder(config, with_pooler=False, recompute=recompute, name="encoder")
        self.qa_outputs = keras.layers.Dense(2, kernel_initializer=initializer(config.initializer_range),
                                             name="qa_outputs")

    def build(self, input_shape=None):
        self.encoder.build()
        self.qa_outputs.build([None, None, self.config.hidden_size])
        self.built = True

    def call(self, features, training=False, dropout_seed=None):
        sequence_output = self.encoder(features, training=training, dropout_seed=dropout_seed)  # [B, L, H]
        logits = tf.cast(self.qa_outputs(sequence_output), tf.float32)                           # [B, L, 2]
        length = tf.shape(logits)[1]
        slots = tf.shape(features["cls_positions"])[1]
        row_positions = features["cls_positions"][:, :, None] + tf.range(length)[None, None, :]    # [B, S, L]
        inside_the_row = row_positions < length
        row_positions = tf.minimum(row_positions, length - 1)
        owner = tf.gather(features["sequence_ids"], row_positions, batch_dims=1)                  # [B, S, L]
        own = inside_the_row & (owner == tf.range(1, slots + 1)[None, :, None])
        local = tf.gather(logits, row_positions, batch_dims=1)                                    # [B, S, L, 2]
        local = tf.where(own[..., None], local, OUTSIDE_THE_SEQUENCE)
        return {"start_logits": local[..., 0], "end_logits": local[..., 1]}

    def get_config(self):
        return {"config": self.config.to_dict(), "recompute": self.recompute}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig(**config["config"]), config.get("recompute", "none"))
