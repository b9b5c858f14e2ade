"""BERT for pre-training on packed rows, in Keras 3 on TensorFlow.

A row holds one or more sequences. Only four things differ from BERT on one sequence per row:
positions restart at 0 for each sequence (gathered from `positions`), attention stays inside a
sequence (block-diagonal mask from the sequence indices, `sequence_ids`), the masked-LM head is
applied only at `masked_lm_positions`, and the NSP head reads each sequence's own [CLS] at
`next_sentence_positions`. Everything else is token-wise and does not care who shares a row
(docs/model.md).

Shape legend: B batch, L max_seq_length, H hidden_size, N attention heads, D = H / N,
I intermediate_size, V vocab_size, P' predictions per row, S sequences per row.

Mixed precision: under a `mixed_bfloat16` or `mixed_float16` policy the matmuls run in half
precision while LayerNorm, the attention softmax and the returned logits are float32.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from bert_packed.model.config import BertConfig

LAYER_NORM_EPSILON = 1e-12  # google-research/bert's, in every layer norm


def attention_mask_from_sequence_ids(sequence_ids: tf.Tensor) -> tf.Tensor:
    """Block-diagonal attention mask: token i may attend to token j iff they share a sequence.

    Padding (index 0) attends only to padding, which keeps every softmax row finite.

    >>> attention_mask_from_sequence_ids(tf.constant([[1, 1, 2, 0]])).numpy().astype(int)[0]
    array([[1, 1, 0, 0],
           [1, 1, 0, 0],
           [0, 0, 1, 0],
           [0, 0, 0, 1]])

    Args:
      sequence_ids: int [B, L], the sequence index of each token (1..S), 0 for padding.

    Returns:
      bool [B, L, L].
    """
    return tf.equal(sequence_ids[:, :, None], sequence_ids[:, None, :])


def attention_bias_from_mask(mask: tf.Tensor) -> tf.Tensor:
    """float32 additive attention bias, 0 where allowed and -10000 where not (google-research).

    Built once per forward pass from a bool mask [B, L, L] (or [B, 1, L] for padding only) and
    broadcast over heads: [B, 1, L, L].
    """
    return (1.0 - tf.cast(mask[:, None, :, :], tf.float32)) * -10000.0


def _initializer(config_range: float):
    return keras.initializers.TruncatedNormal(stddev=config_range)


class BertEmbeddings(keras.layers.Layer):
    """Word + per-sequence position + token-type embeddings, LayerNorm, dropout."""

    def __init__(self, vocab_size, hidden_size, max_position_embeddings, type_vocab_size, initializer_range,
                 dropout, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.dropout = dropout
        self.layer_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32", name="LayerNorm")
        self.dropout_layer = keras.layers.Dropout(dropout)

    def build(self, input_shape=None):
        init = _initializer(self.initializer_range)
        self.word_embeddings = self.add_weight(name="word_embeddings", shape=[self.vocab_size, self.hidden_size],
                                               initializer=init)
        self.position_embeddings = self.add_weight(
            name="position_embeddings", shape=[self.max_position_embeddings, self.hidden_size], initializer=init)
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings", shape=[self.type_vocab_size, self.hidden_size], initializer=init)
        self.layer_norm.build([None, None, self.hidden_size])

    def call(self, input_ids, segment_ids, positions, training=False):
        embeddings = (tf.gather(self.word_embeddings, input_ids)            # [B, L, H]
                      + tf.gather(self.position_embeddings, positions)
                      + tf.gather(self.token_type_embeddings, segment_ids))
        embeddings = tf.cast(self.layer_norm(embeddings), self.compute_dtype)
        return self.dropout_layer(embeddings, training=training)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "max_position_embeddings": self.max_position_embeddings, "type_vocab_size": self.type_vocab_size,
                "initializer_range": self.initializer_range, "dropout": self.dropout}


class TransformerLayer(keras.layers.Layer):
    """Post-LayerNorm transformer layer: self-attention, then an exact-erf GELU feed-forward."""

    def __init__(self, hidden_size, num_attention_heads, intermediate_size, initializer_range, hidden_dropout_prob,
                 attention_probs_dropout_prob, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.initializer_range = initializer_range
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        init = _initializer(initializer_range)
        self.query = keras.layers.Dense(hidden_size, kernel_initializer=init, name="query")
        self.key = keras.layers.Dense(hidden_size, kernel_initializer=init, name="key")
        self.value = keras.layers.Dense(hidden_size, kernel_initializer=init, name="value")
        self.attention_output = keras.layers.Dense(hidden_size, kernel_initializer=init, name="attention_output")
        self.attention_layer_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32",
                                                                    name="attention_layer_norm")
        self.intermediate = keras.layers.Dense(intermediate_size, kernel_initializer=init, name="intermediate")
        self.output_dense = keras.layers.Dense(hidden_size, kernel_initializer=init, name="output")
        self.output_layer_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32",
                                                                 name="output_layer_norm")
        self.attention_dropout = keras.layers.Dropout(attention_probs_dropout_prob)
        self.hidden_dropout = keras.layers.Dropout(hidden_dropout_prob)

    def build(self, input_shape):
        hidden, intermediate = [None, None, self.hidden_size], [None, None, self.intermediate_size]
        for layer in (self.query, self.key, self.value, self.attention_output, self.intermediate):
            layer.build(hidden)
        self.output_dense.build(intermediate)
        self.attention_layer_norm.build(hidden)
        self.output_layer_norm.build(hidden)

    def call(self, hidden_states, attention_bias, training=False):
        batch, length = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        heads, head_size = self.num_attention_heads, self.hidden_size // self.num_attention_heads

        def split_heads(x):  # [B, L, H] -> [B, N, L, D]
            return tf.transpose(tf.reshape(x, [batch, length, heads, head_size]), [0, 2, 1, 3])

        query = split_heads(self.query(hidden_states))
        key = split_heads(self.key(hidden_states))
        value = split_heads(self.value(hidden_states))
        scores = tf.matmul(query, key, transpose_b=True)                      # [B, N, L, L]
        scores = tf.cast(scores, tf.float32) * (1.0 / math.sqrt(head_size))
        scores += tf.cast(attention_bias, tf.float32)  # [B, 1, L, L]; Keras casts float inputs to compute dtype
        probabilities = tf.nn.softmax(scores, axis=-1)                        # float32
        probabilities = self.attention_dropout(tf.cast(probabilities, self.compute_dtype), training=training)
        context = tf.matmul(probabilities, value)                             # [B, N, L, D]
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, length, self.hidden_size])

        attention = self.hidden_dropout(self.attention_output(context), training=training)
        hidden_states = tf.cast(self.attention_layer_norm(hidden_states + attention), self.compute_dtype)
        intermediate = tf.nn.gelu(self.intermediate(hidden_states), approximate=False)   # [B, L, I]
        output = self.hidden_dropout(self.output_dense(intermediate), training=training)
        return tf.cast(self.output_layer_norm(hidden_states + output), self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size,
                "num_attention_heads": self.num_attention_heads, "intermediate_size": self.intermediate_size,
                "initializer_range": self.initializer_range, "hidden_dropout_prob": self.hidden_dropout_prob,
                "attention_probs_dropout_prob": self.attention_probs_dropout_prob}


class MaskedLMHead(keras.layers.Layer):
    """Dense + GELU + LayerNorm at the masked positions, then the tied word embeddings + a bias."""

    def __init__(self, hidden_size, vocab_size, initializer_range, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.initializer_range = initializer_range
        self.transform = keras.layers.Dense(hidden_size, kernel_initializer=_initializer(initializer_range),
                                            name="transform")
        self.layer_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32", name="LayerNorm")

    def build(self, input_shape=None):
        self.transform.build([None, None, self.hidden_size])
        self.layer_norm.build([None, None, self.hidden_size])
        self.output_bias = self.add_weight(name="output_bias", shape=[self.vocab_size], initializer="zeros")

    def call(self, sequence_output, masked_lm_positions, word_embeddings):
        hidden = tf.gather(sequence_output, masked_lm_positions, batch_dims=1)   # [B, P', H]
        hidden = tf.nn.gelu(self.transform(hidden), approximate=False)
        hidden = tf.cast(self.layer_norm(hidden), self.compute_dtype)
        logits = tf.matmul(hidden, tf.cast(word_embeddings, self.compute_dtype), transpose_b=True)  # [B, P', V]
        # Keras reads variables in the compute dtype inside call(); logits are float32.
        return tf.cast(logits, tf.float32) + tf.cast(self.output_bias, tf.float32)

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
                "initializer_range": self.initializer_range}


class NextSentenceHead(keras.layers.Layer):
    """Pooler (dense + tanh) on each sequence's own [CLS], then a 2-way classifier."""

    def __init__(self, hidden_size, initializer_range, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.initializer_range = initializer_range
        init = _initializer(initializer_range)
        self.pooler = keras.layers.Dense(hidden_size, activation="tanh", kernel_initializer=init, name="pooler")
        self.classifier = keras.layers.Dense(2, kernel_initializer=init, name="seq_relationship")

    def build(self, input_shape=None):
        self.pooler.build([None, None, self.hidden_size])
        self.classifier.build([None, None, self.hidden_size])

    def call(self, sequence_output, next_sentence_positions):
        cls = tf.gather(sequence_output, next_sentence_positions, batch_dims=1)  # [B, S, H]
        return tf.cast(self.classifier(self.pooler(cls)), tf.float32)           # [B, S, 2]

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size,
                "initializer_range": self.initializer_range}


class BertPretrainingModel(keras.Model):
    """BERT with masked-LM and next-sentence heads, called on the packed feature dict.

    Inputs (int32): input_ids, sequence_ids (sequence index per token, 1..S, 0 padding; the
    records' input_mask), segment_ids, positions [B, L]; masked_lm_positions [B, P'];
    next_sentence_positions [B, S]. Other keys (labels, prediction_sequence_ids, weights) are
    ignored.

    Args:
      config: the BERT hyper-parameters.
      next_sentence_prediction: with the next-sentence head (pooler and classifier); without it
        the model is masked-LM only (RoBERTa's objective), and no [CLS] output is gathered.

    Returns:
      {"mlm_logits": float32 [B, P', V], "nsp_logits": float32 [B, S, 2]} ("nsp_logits" only
      with the next-sentence head).
    """

    def __init__(self, config: BertConfig, next_sentence_prediction: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.next_sentence_prediction = next_sentence_prediction
        self.embeddings = BertEmbeddings(config.vocab_size, config.hidden_size, config.max_position_embeddings,
                                         config.type_vocab_size, config.initializer_range,
                                         config.hidden_dropout_prob, name="embeddings")
        self.encoder_layers = [
            TransformerLayer(config.hidden_size, config.num_attention_heads, config.intermediate_size,
                             config.initializer_range, config.hidden_dropout_prob,
                             config.attention_probs_dropout_prob, name=f"layer_{i}")
            for i in range(config.num_hidden_layers)]
        self.masked_lm = MaskedLMHead(config.hidden_size, config.vocab_size, config.initializer_range,
                                      name="masked_lm")
        self.next_sentence = (NextSentenceHead(config.hidden_size, config.initializer_range, name="next_sentence")
                              if next_sentence_prediction else None)

    def build(self, input_shape=None):
        self.embeddings.build()
        for layer in self.encoder_layers:
            layer.build([None, None, self.config.hidden_size])
        self.masked_lm.build()
        if self.next_sentence is not None:
            self.next_sentence.build()
        self.built = True

    def encode(self, features, training=False):
        """The encoder's output for every token: [B, L, H] (compute dtype)."""
        hidden = self.embeddings(features["input_ids"], features["segment_ids"], features["positions"],
                                 training=training)
        bias = attention_bias_from_mask(attention_mask_from_sequence_ids(features["sequence_ids"]))
        for layer in self.encoder_layers:
            hidden = layer(hidden, bias, training=training)
        return hidden

    def call(self, features, training=False):
        sequence_output = self.encode(features, training=training)
        outputs = {"mlm_logits": self.masked_lm(sequence_output, features["masked_lm_positions"],
                                                self.embeddings.word_embeddings)}
        if self.next_sentence is not None:
            outputs["nsp_logits"] = self.next_sentence(sequence_output, features["next_sentence_positions"])
        return outputs

    def get_config(self):
        return {"config": self.config.to_dict(), "next_sentence_prediction": self.next_sentence_prediction}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig(**config["config"]), config.get("next_sentence_prediction", True))
