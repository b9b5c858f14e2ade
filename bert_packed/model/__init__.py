"""The packed BERT model: config, encoder, pre-training and fine-tuning heads, checkpoint import/export.

The names below load on first use, so that `bert_packed.model.config` (BertConfig) can be read
without loading TensorFlow (the command line's flags take their defaults from it).
"""

import importlib

_EXPORTS = {
    "bert_packed.model.checkpoint": ("CheckpointError", "export_google_checkpoint", "google_variable_names",
                                     "load_google_checkpoint"),
    "bert_packed.model.config": ("RECOMPUTE", "BertConfig", "ConfigError"),
    "bert_packed.model.huggingface": ("export_huggingface", "load_huggingface", "load_weights",
                                      "require_same_model"),
    "bert_packed.model.modeling": ("BertEmbeddings", "BertEncoder", "BertPretrainingModel", "MaskedLMHead",
                                   "TransformerLayer", "attention_mask_from_sequence_ids"),
    "bert_packed.model.task_models": ("BertClassifierModel", "BertQuestionAnsweringModel"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
