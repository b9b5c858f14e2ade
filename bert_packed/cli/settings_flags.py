"""The flags of a command, made from its settings (bert_packed.settings): one flag a setting field,
of the field's name, type and default, with its help (and the MLPerf reference's default where it
differs), so that a setting is written once. Each command keeps its flags in a FlagValues of its
own (`FLAGS = flags.FlagValues()` in its module), not in absl's global one: commands define flags
of the same names, and several run one after another in one process (a job, the tests)."""

from __future__ import annotations

import dataclasses
import sys

from absl import flags

from bert_packed.settings import settings_of


def define_flags(flag_values: flags.FlagValues, *kinds: type, module_name: str) -> None:
    """Defines in `flag_values` (the command's) a flag for each setting of the dataclasses
    `kinds`, as defined by the command module `module_name` (its --help lists them)."""
    if module_name == "__main__":  # run as `python -m bert_packed.cli.X`: absl's name for it is the script's
        module_name = sys.argv[0]
    for field in settings_of(*kinds):
        _define(field, flag_values, module_name)
        for alias in field.metadata["aliases"]:
            flags.DEFINE_alias(alias, field.name, flag_values=flag_values, module_name=module_name)


def from_flags(flag_values: flags.FlagValues, kind: type, **values):
    """The dataclass `kind` of its settings' flags' values in `flag_values` (and `values`, its
    other fields), which checks them as it is built."""
    return kind(**{field.name: flag_values[field.name].value for field in settings_of(kind)}, **values)


def given_flags(flag_values: flags.FlagValues, *kinds: type) -> frozenset[str]:
    """The names of the settings of `kinds` whose flags in `flag_values` were given (on the
    command line or in a flagfile)."""
    return frozenset(field.name for field in settings_of(*kinds) if flag_values[field.name].present)


def flag_help(field: dataclasses.Field) -> str:
    """The setting's help, with the reference's default where it differs."""
    text = field.metadata["help"].rstrip(".")
    if "reference_default" not in field.metadata:
        return text + "."
    said = f"reference default {field.metadata['reference_default']}"
    return f"{text[:-1]}; {said})." if text.endswith(")") else f"{text} ({said})."


def _define(field: dataclasses.Field, flag_values: flags.FlagValues, module_name: str) -> None:
    name, default, help_text = field.name, field.default, flag_help(field)
    kind = str(field.type).split(" |")[0]  # "int | None" -> "int": None is the flag's "not given"
    choices = field.metadata["choices"]
    if choices:
        flags.DEFINE_enum(name, default, list(choices), help_text, flag_values=flag_values, module_name=module_name)
    elif kind == "bool":
        flags.DEFINE_boolean(name, default, help_text, flag_values=flag_values, module_name=module_name)
    elif kind == "int":
        flags.DEFINE_integer(name, default, help_text, flag_values=flag_values, module_name=module_name)
    elif kind == "float":
        flags.DEFINE_float(name, default, help_text, flag_values=flag_values, module_name=module_name)
    elif kind.startswith("tuple"):
        flags.DEFINE_list(name, None if default is None else list(default), help_text, flag_values=flag_values,
                          module_name=module_name)
    elif kind == "str":
        flags.DEFINE_string(name, default, help_text, flag_values=flag_values, module_name=module_name)
    else:
        raise TypeError(f"setting {name}: no flag type for {field.type!r}")
