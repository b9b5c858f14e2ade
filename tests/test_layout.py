"""The layout holds: imports run one way, and each concept has one owner (README, Layout)."""

import ast
import inspect
import os
import pkgutil

import pytest
from conftest import REPO

import bert_packed
from bert_packed import errors

# A module may import project modules of its own rank or below, never above.
RANKS = {
    "__init__": 0, "errors": 0, "features": 0, "settings": 0, "console": 0, "storage": 0, "inputs": 0,
    "records": 1, "update_program": 1,
    "packing": 2, "pretraining_data": 2, "finetuning": 2,
    "model": 3, "beam": 3,
    "training": 4, "reports": 4,
    "cli": 5, "doctor": 5, "vocab": 5,
}
# Modules on the data path: they must not import TensorFlow when they are imported.
WITHOUT_TENSORFLOW = ("errors", "features", "settings", "console", "storage", "inputs", "records", "packing",
                      "pretraining_data", "finetuning", "beam", "update_program")


def python_files(*folders):
    for folder in folders:
        for root, _, names in os.walk(os.path.join(REPO, folder)):
            for name in sorted(names):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(root, name), REPO)


def top_part(path):
    """bert_packed/packing/plan.py -> "packing"; bert_packed/features.py -> "features"."""
    parts = path.split(os.sep)[1:]
    return parts[0].removesuffix(".py")


def module_level_imports(tree):
    """Names imported at module level (not inside functions), as dotted module names."""
    for node in tree.body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def all_imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


LIBRARY = sorted(python_files("bert_packed"))


@pytest.mark.parametrize("path", LIBRARY)
def test_imports_run_one_way(path):
    tree = ast.parse(open(os.path.join(REPO, path)).read())
    rank = RANKS[top_part(path)]
    for name in all_imports(tree):
        if name.startswith("bert_packed."):
            imported = name.split(".")[1]
            assert RANKS[imported] <= rank, f"{path} imports {name}, which sits above it"
        if name.startswith("absl"):
            assert top_part(path) == "cli", f"{path} imports {name}: flags are parsed only in bert_packed/cli"
    if top_part(path) in WITHOUT_TENSORFLOW:
        tensorflow = [n for n in module_level_imports(tree) if n.split(".")[0] in ("tensorflow", "keras")]
        assert not tensorflow, f"{path} imports {tensorflow} when it is imported"


def constants_outside_docstrings(tree):
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in docstrings]


def places(predicate, folders=("bert_packed", "scripts")):
    found = set()
    for path in python_files(*folders):
        tree = ast.parse(open(os.path.join(REPO, path)).read())
        if predicate(tree):
            found.add(path)
    return found


def uses_attribute(name):
    return lambda tree: any(isinstance(node, ast.Attribute) and node.attr == name for node in ast.walk(tree))


def test_each_concept_has_one_owner():
    # The feature spec, metadata.json, the temp-then-rename writer and the error printer.
    assert places(uses_attribute("FixedLenFeature")) == {"bert_packed/features.py"}
    assert places(lambda tree: any(node.value == "metadata.json" for node in constants_outside_docstrings(tree))) == {
        "bert_packed/inputs/dataset_info.py"}
    assert places(lambda tree: any(isinstance(node, ast.Attribute) and node.attr == "replace"
                                   and isinstance(node.value, ast.Name) and node.value.id == "os"
                                   for node in ast.walk(tree))) == {"bert_packed/storage/files.py"}
    assert places(uses_attribute("exit"), ("bert_packed",)) == {"bert_packed/cli/common.py"}


def exception_classes():
    classes = {}
    for module in pkgutil.walk_packages(bert_packed.__path__, "bert_packed."):
        if module.name.endswith("__main__") or module.name.startswith("bert_packed.cli."):
            continue  # commands: each defines its flags in the one process that runs it
        imported = __import__(module.name, fromlist=["_"])
        for name, value in vars(imported).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.name:
                classes[name] = value
    return classes


def test_every_error_a_user_can_cause_derives_from_user_error():
    classes = exception_classes()
    # An invalid plan or a lost sequence: a traceback helps. A failed LP never leaves lp_packing.
    bugs = {"InternalError", "PlanError", "PackingError", "PackingLPError"}
    assert bugs <= set(classes)
    for name, kind in classes.items():
        assert issubclass(kind, errors.UserError) != (name in bugs), name
    assert {"OutputDirectoryError", "RecordError", "CorruptRecordError", "HistogramError", "ConfigError",
            "CheckpointError", "TrainingError", "DatasetInfoError", "CorpusError", "VocabularyError",
            "RunError", "SettingsError", "InputFilesError", "StorageError"} <= set(classes)
    assert {"PlanError", "PackingError"} == {name for name, kind in classes.items()
                                            if issubclass(kind, errors.InternalError) and name != "InternalError"}


def test_no_module_over_500_lines():
    too_long = [f"{path}: {lines} lines" for path in python_files("bert_packed")
                if (lines := len(open(os.path.join(REPO, path), encoding="utf-8").read().splitlines())) > 500]
    assert not too_long, "\n".join(too_long)


def test_no_class_over_250_lines_and_no_function_over_60():
    """What a newcomer reads fits on a screen or two: the run's loop included (training/loop.py), the
    scripts and the tests too."""
    too_long = []
    for path in python_files("bert_packed", "scripts", "tests"):
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                lines, limit = node.end_lineno - node.lineno + 1, 250 if isinstance(node, ast.ClassDef) else 60
                if lines > limit:
                    too_long.append(f"{path}:{node.lineno} {node.name}: {lines} lines (at most {limit})")
    assert not too_long, "\n".join(too_long)
    with open(os.path.join(REPO, "bert_packed", "training", "loop.py"), encoding="utf-8") as f:
        names = {node.name for node in ast.parse(f.read()).body if isinstance(node, ast.FunctionDef)}
    assert "train_and_evaluate" in names
