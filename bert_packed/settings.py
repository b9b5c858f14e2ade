"""A setting is declared once: a dataclass field with its default, its help and its purpose.

    train_batch_size: int = setting(8, "Rows per micro-batch, all replicas.", group="batch and schedule",
                                    reference_default=32, first_run=True)

The command line defines each such field as the flag of its name (bert_packed.cli.settings_flags:
its type, default and help from here, "reference default 32" added to the help), and lists it in
`--help` under its group; the code, the tests and run.json use the same name. A field without
`setting` (a value the command fills, such as the parsed BERT config) has no flag.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Sequence

from bert_packed.errors import SettingsError

_NO_DEFAULT = object()


def setting(default, help: str, *, group: str, changeable: bool = False, reference_default=_NO_DEFAULT,
            choices: Sequence[str] | None = None, first_run: bool = False,
            aliases: Sequence[str] = ()) -> dataclasses.Field:
    """A dataclass field that is a setting of a command.

    Args:
      default: the default (where it differs from the MLPerf reference's, give reference_default).
      help: what the setting does, for --help.
      group: the purpose it is listed under in --help ("model", "evaluation", ...).
      changeable: not part of a run's identity: a resumed run may give another value.
      reference_default: the MLPerf reference's default, said in the help, when it differs.
      choices: the values it may take (an enum flag).
      first_run: one of the few settings a first run sets (marked in --help).
      aliases: other names its flag answers to (--max-sequences-per-pack, say).
    """
    metadata = {"help": help, "group": group, "changeable": changeable, "choices": tuple(choices or ()),
                "first_run": first_run, "aliases": tuple(aliases)}
    if reference_default is not _NO_DEFAULT:
        metadata["reference_default"] = reference_default
    return dataclasses.field(default=default, metadata=metadata)


def is_setting(field: dataclasses.Field) -> bool:
    """Whether `field` was declared with setting() (it then has a flag)."""
    return "help" in field.metadata


def settings_of(*kinds: type) -> list[dataclasses.Field]:
    """The setting fields of the dataclasses `kinds`, in their order."""
    return [field for kind in kinds for field in dataclasses.fields(kind) if is_setting(field)]


def help_groups(*kinds: type) -> dict[str, list[str]]:
    """{group: [setting name, ...]} of the dataclasses `kinds`, groups in the order first met."""
    groups: dict[str, list[str]] = {}
    for field in settings_of(*kinds):
        groups.setdefault(field.metadata["group"], []).append(field.name)
    return groups


def first_run_settings(*kinds: type) -> tuple[str, ...]:
    """The names of the settings a first run sets."""
    return tuple(field.name for field in settings_of(*kinds) if field.metadata["first_run"])


def check_setting(field: dataclasses.Field, value):
    """Refuses a value of another type than its flag's, or outside its choices, as the command
    line's parser would: what a caller from Python meets (a notebook's "8" for 8, say). Returns
    the value as the flag's type: a NumPy integer or number as Python's int or float (run.json and
    metadata.json are JSON), a pathlib.Path as its string, a list as a tuple.

    Raises:
      SettingsError: naming the flag and what it expects.
    """
    declared = str(field.type)
    kind = declared.split(" |")[0]
    if value is None:
        if "None" in declared:
            return None
        raise SettingsError(f"--{field.name}: None; expected {_expected(kind)}")
    if kind.startswith("tuple"):
        if not isinstance(value, (tuple, list)):
            raise SettingsError(f"--{field.name}={value!r}: a {type(value).__name__}; expected {_expected(kind)}")
        item_kind = kind.removeprefix("tuple[").split(",")[0]
        elements = tuple(_as_kind(item, item_kind, element=True) for item in value)
        if None in elements:
            wrong = value[elements.index(None)]
            raise SettingsError(f"--{field.name}={list(value)!r}: {wrong!r} is a {type(wrong).__name__}; expected "
                                f"{_expected(kind)}")
        return elements
    checked = _as_kind(value, kind)
    if checked is None:
        raise SettingsError(f"--{field.name}={value!r}: a {type(value).__name__}; expected {_expected(kind)}")
    choices = field.metadata["choices"]
    if choices and checked not in choices:
        raise SettingsError(f"--{field.name}={checked}: expected one of {', '.join(choices)}")
    return checked


def _as_kind(value, kind: str, element: bool = False):
    """`value` as a value of the flag type `kind` (bool, int, float, str), or None where it is not
    one. A list flag's int elements (`element`) may also be strings, as the command line gives
    them: they are parsed where they are read."""
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if kind == "int" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if kind == "float" and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if kind == "str" or (kind == "int" and element):
        value = os.fspath(value) if kind == "str" and isinstance(value, os.PathLike) else value
        return str(value) if isinstance(value, str) else None
    return None


def _expected(kind: str) -> str:
    """What a flag of type `kind` takes, in words."""
    if kind.startswith("tuple"):
        element = kind.removeprefix("tuple[").split(",")[0]
        return f"a list of {'integers' if element == 'int' else 'strings'}"
    return _EXPECTED[kind]


def check_settings(settings, kind: type | None = None) -> None:
    """check_setting of every setting of the dataclass instance `settings` (or of its part
    `kind`, a dataclass it derives from), each value kept as check_setting returns it."""
    for field in settings_of(kind or type(settings)):
        value = getattr(settings, field.name)
        checked = check_setting(field, value)
        if checked is not value:
            object.__setattr__(settings, field.name, checked)  # frozen: a value of its own type, once


def require_given(settings, *names: str) -> None:
    """Refuses a settings value without the settings `names` (None or empty): the command line's
    required flags, as a caller from Python meets them.

    Raises:
      SettingsError: "--output_dir is required", for the first one missing.
    """
    for name in names:
        if not getattr(settings, name):
            raise SettingsError(f"--{name} is required")


def given_or_changed(settings) -> frozenset[str]:
    """The settings of `settings` (a dataclass with a `given` field) that were given: those its
    command line gave, and any whose value is not its default (a caller from Python gives no
    `given`)."""
    return frozenset(settings.given) | {field.name for field in settings_of(type(settings))
                                        if getattr(settings, field.name) != field.default}


_EXPECTED = {"bool": "True or False", "int": "an integer", "float": "a number", "str": "a string"}
