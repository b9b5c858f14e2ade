"""The packed BERT model: config, encoder and pre-training heads, checkpoint import/export."""

from bert_packed.model.checkpoint import (
    CheckpointError,
    export_google_checkpoint,
    google_variable_names,
    load_google_checkpoint,
)
from bert_packed.model.config import BertConfig, ConfigError
from bert_packed.model.modeling import (
    BertEmbeddings,
    BertPretrainingModel,
    MaskedLMHead,
    NextSentenceHead,
    TransformerLayer,
    attention_mask_from_sequence_ids,
)

__all__ = ["BertConfig", "BertEmbeddings", "BertPretrainingModel", "CheckpointError", "ConfigError", "MaskedLMHead",
           "NextSentenceHead", "TransformerLayer", "attention_mask_from_sequence_ids", "export_google_checkpoint",
           "google_variable_names", "load_google_checkpoint"]
