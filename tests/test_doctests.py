"""The worked examples in the docstrings are tests too: every module that shows one."""

import doctest
import importlib
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules_with_examples():
    for root, _, names in os.walk(os.path.join(REPO, "bert_packed")):
        for name in sorted(names):
            path = os.path.join(root, name)
            if name.endswith(".py") and ">>> " in open(path, encoding="utf-8").read():
                yield os.path.relpath(path, REPO).removesuffix(".py").replace(os.sep, ".").removesuffix(".__init__")


MODULES = sorted(modules_with_examples())


def test_the_new_modules_examples_are_found():
    assert {"bert_packed.packing.assign", "bert_packed.finetuning.encode", "bert_packed.finetuning.metrics",
            "bert_packed.packing.plan", "bert_packed.model.modeling"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(REPO)  # examples name the shipped data by its path in the checkout
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no worked examples"
    assert result.failed == 0
