"""Not a command: what the jobs (scripts/main_job.py, scripts/finetune_job.py) are made of: their
stages' lines, and commands run one after another in this process (bert_packed.cli.in_process),
each skipped where its output is already there."""

from __future__ import annotations

import gc
import importlib
import os
import re
import sys

from absl import flags

from bert_packed.cli.common import process_flags
from bert_packed.cli.in_process import run_in_process
from bert_packed.errors import SettingsError
from bert_packed.storage import files
from bert_packed.storage.files import write_text_atomically
from bert_packed.training.step_pool import StepPool


def print_stage(number: int, total: int, what: str) -> None:
    """A stage's line: "== 3/9 what it does"."""
    print(f"== {number}/{total} {what}", flush=True)


def command(module: str, *args: str, steps: StepPool | None = None) -> None:
    """Runs a command in this process, a training command on a compiled step of `steps` (the
    job's StepPool); a failure ends the job with the command's exit status."""
    sys.stdout.flush()
    status = run_in_process(module, list(args), steps=steps)
    if status:
        sys.exit(status)
    gc.collect()  # the command's models and datasets: a dozen commands then take the memory of one


def command_unless_done(done: str, module: str, *args: str, made_from: tuple[str, ...] = (),
                        made_with: str | None = None, steps: StepPool | None = None) -> None:
    """command(), unless the file `done` is there, newer than every file of `made_from` (the
    records it measured, say: made again since, it is done again), and made with `made_with` (the
    model and flags it measured, recorded beside it as <done>.with): the commands whose output is
    a file, not a directory that says whether it is finished."""
    record = f"{done}.with"
    same = made_with is None or (os.path.exists(record) and read_text(record) == made_with)
    if same and os.path.exists(done) and all(os.path.getmtime(done) >= os.path.getmtime(path)
                                             for path in made_from if os.path.exists(path)):
        print(f"already done: {done}", flush=True)
        return
    command(module, *args, steps=steps)
    if made_with is not None:
        write_text_atomically(record, made_with)


def read_text(path: str) -> str:
    """A text file's content; a BERT config or a vocabulary may be a gs:// or file:// one."""
    with files.open_file(path) as f:
        return f.read()


def flags_of(module: str, name: str, words: list[str]) -> list[str]:
    """`words` (the job's flag `name`), each a flag that the command `module` takes with a value it
    takes: a typo is said before any stage, not when its stage comes minutes later."""
    own = importlib.import_module(module).FLAGS
    command_flags = {**process_flags(), **{flag: own[flag] for flag in own}}
    for word in words:
        key, given, value = word.removeprefix("--").partition("=")
        flag = command_flags[key] if key in command_flags else None
        negated = key.startswith("no") and key[2:] in command_flags and command_flags[key[2:]].boolean
        if not word.startswith("--") or (flag is None and not negated):
            raise SettingsError(f"--{name}: {word!r}: {module.rsplit('.', 1)[-1]} has no such flag "
                                f"(--{name} holds flags, --name=value)")
        try:
            if given and flag is not None:
                flag.parser.parse(value)  # the value checked, not set
        except (flags.Error, ValueError) as e:
            raise SettingsError(f"--{name}: {word}: flag --{flag.name}={value}: {e}") from None
    return words


def seed_values(name: str, values: list[str]) -> list[str]:
    """The seeds of the job's flag `name`, each an integer from 0 to 2**32 - 1 (written plainly)."""
    for value in values:
        if not re.fullmatch(r"[0-9]+", value.strip()) or int(value) >= 2**32:
            raise SettingsError(f"--{name}={','.join(values)}: {value!r} is not a seed: expected integers from 0 "
                                f"to 2**32 - 1 separated by commas (--{name}=1,2,3)")
    return [str(int(value)) for value in values]
