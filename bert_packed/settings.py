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
from collections.abc import Sequence

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
