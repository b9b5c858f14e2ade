"""The worked examples in the docstrings are tests too."""

import doctest
import importlib

import pytest

MODULES = [
    "bert_packed.features",
    "bert_packed.packing.histogram",
    "bert_packed.packing.greedy",
    "bert_packed.packing.exact_fill",
    "bert_packed.packing.plan",
    "bert_packed.packing.synthetic",
    "bert_packed.pretraining_data.corpus",
    "bert_packed.pretraining_data.tokenization",
    "bert_packed.records.example",
    "bert_packed.packing.packer",
    "bert_packed.packing.online",
    "bert_packed.model.modeling",
    "bert_packed.training.optimizers",
    "bert_packed.training.config",
    "bert_packed.curves",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no worked examples"
    assert result.failed == 0
