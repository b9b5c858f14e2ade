"""BertConfig: the google-research `bert_config.json` keys, checked."""

from __future__ import annotations

import dataclasses
import json
import math

from bert_packed.errors import UserError, raise_if_retryable
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE
from bert_packed.settings import check_settings, require_given, setting
from bert_packed.storage import files

# What export_model writes: a Hugging Face directory, or google-research's TF1 checkpoint.
EXPORT_FORMATS = ("huggingface", "tf1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExportSettings:
    """export_model's settings, by their flags' names."""

    checkpoint: str | None = setting(None, "A run directory (its newest weights), a TF1 checkpoint prefix "
                                           "(model.ckpt-N) or a Hugging Face BERT directory.", group="weights")
    bert_config_file: str | None = setting(None, "The model's bert_config.json (the run's --bert_config_file).",
                                           group="weights")
    vocab_file: str = setting(DEFAULT_VOCAB_FILE, "The vocabulary the model was trained with "
                                                  "(create_pretraining_data's --vocab_file).", group="tokenizer")
    do_lower_case: bool = setting(True, "The tokenizer lower-cases and strips accents (uncased models).",
                                  group="tokenizer")
    output_dir: str | None = setting(None, "Where the exported model goes: a new or empty directory, or one of an "
                                           "earlier export (written over).", group="output")
    format: str = setting("huggingface", "huggingface: config.json, model.safetensors and tokenizer files; tf1: "
                                         "model.ckpt-N (google-research names), bert_config.json, vocab.txt.",
                          group="output", choices=EXPORT_FORMATS)

    def __post_init__(self):
        check_settings(self)
        require_given(self, "checkpoint", "bert_config_file", "output_dir")

# What the backward pass recomputes instead of keeping from the forward pass: nothing; the
# attention block (scores, softmax, dropout, probabilities x values: the [B, N, L, L] tensors,
# most of a packed row's memory at L=512); or each whole transformer layer (only its input kept).
RECOMPUTE = ("none", "attention", "layer")


class ConfigError(UserError, ValueError):
    """A BERT config file is unreadable or has a bad value."""


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """BERT hyper-parameters, named as in google-research/bert (and MLPerf) config files."""

    vocab_size: int = 30522
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
                raise ConfigError(f"{name} must be a positive integer below 2**31, got {value!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a number, got {value!r}")
        if self.initializer_range <= 0:
            raise ConfigError(f"initializer_range must be positive, got {self.initializer_range!r}")
        weights = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * self.hidden_size + \
            self.num_hidden_layers * (4 * self.hidden_size + 2 * self.intermediate_size) * self.hidden_size
        if weights > 2**36:
            raise ConfigError(f"{weights:,} weights: far beyond any BERT (BERT-Large has about 335 million); check "
                              f"vocab_size, hidden_size, intermediate_size and num_hidden_layers")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                              f"{self.num_attention_heads}")
        if self.hidden_act != "gelu":
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported (BERT uses 'gelu')")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> BertConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown keys {unknown}; expected google-research names {sorted(known)}")
        try:
            return cls(**values)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path: str) -> BertConfig:
        """Reads a google-research `bert_config.json`."""
        try:
            with files.open_file(path) as f:
                values = json.load(f)
        except OSError as e:
            raise_if_retryable(e)
            raise ConfigError(f"{path}: cannot read the BERT config: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a JSON object of BERT hyper-parameters")
        return cls.from_dict(values, source=path)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
