"""What every command shares: how it starts and how it fails.

`run` is the one way a command runs: --help prints the command's own flags and exits 0 (--helpfull
every flag, absl's and TensorFlow's too); absl parses the flags (flagfiles included) into the
command's own FlagValues, which also holds absl's process-wide ones (--verbosity, --logtostderr,
...), each run starting from the defaults; what the command logs is plain lines ("warning: "
before a warning; absl's own format with --verbosity=1), TensorFlow's INFO chatter is left out,
and a warning repeated with other values is shown three times and then counted in one line at
the end; and then
- a bad flag, or a UserError raised anywhere below (bert_packed.errors), prints one line,
  `<program>: error: <message>`, and exits with status 2;
- a StorageError (bert_packed.storage.files: the storage refusing a path) is such a line naming the path;
  a full disk (or quota, or file-size limit) says what is kept; a request the storage still
  failed after retrying says that the same command goes on, status 75;
- Ctrl-C (SIGINT) outside a loop that handles it prints one line saying what is kept, status 130,
  SIGTERM 143;
- any other exception (InternalError, an OSError or a TensorFlow error no storage request
  raised) is a bug: its traceback, then a line that says so, status 1;
- a closed pipe on stdout (`| head`) ends the command quietly.
The errors are told apart by their classes alone: each was converted where it happened.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import re
import signal
import sys
import tempfile
import textwrap
import traceback
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags
from absl import logging as absl_logging

from bert_packed.errors import StorageError, UserError
from bert_packed.storage import files

# Interrupted by SIGINT (Ctrl-C): the shell's 128 + 2.
EXIT_BUG = 1  # what Python gives an uncaught exception
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # the shell's 128 + 15, as if SIGTERM had not been caught
EXIT_TRY_AGAIN = 75  # sysexits' EX_TEMPFAIL: the storage failed; the same command again goes on


class Terminated(BaseException):
    """SIGTERM outside the trainer's loop: unwinds like Ctrl-C (not caught as an Exception), so
    that what is being written is cleaned up and the command says so in one line."""


def _terminated(signum, frame) -> None:
    raise Terminated()

def run(main: Callable[[list[str]], int | None], program: str, output_flag: str | tuple[str, ...], kept: str, *,
        flag_values: flags.FlagValues, positional: bool = False, pass_on: bool = False) -> None:
    """Parses the flags and runs main(argv) (argv: the program and its positional arguments).

    Args:
      main: the command's body; what it returns is the exit status (None: 0), as a benchmark's 1
        says that a target was missed.
      program: the command's name, for messages.
      flag_values: the command's own flags (its module's FLAGS).
      output_flag: the flag naming where the command writes (the first given, of several), for the
        full-disk message; when none of them is given (or there are none, `()`), the command
        writes only temporary files (a benchmark's) and the message names the temporary directory.
      kept: what survives a full disk, for the message ("Finished shards are kept", say).
      positional: the command takes positional arguments; else one is refused, since it is most
        often the rest of an unquoted glob the shell expanded (`--input_files=DIR/part-*` reads the
        first file and leaves the others as arguments).
      pass_on: flags the command does not define are left in argv for main (a Beam command's
        pipeline options), not refused here.
    """

    def guarded(argv: list[str]) -> int | None:
        counter = _configure_output(flag_values.verbosity)
        signal.signal(signal.SIGTERM, _terminated)  # the trainer's loop sets its own, and puts this back
        try:
            try:
                _check_output_files(flag_values, output_flag)
                return main(argv)  # app.run exits with it
            finally:  # before the last line, which says how the command ended
                counter.say_what_was_held_back()
        except KeyboardInterrupt:
            exit_with(EXIT_INTERRUPTED, f"{program}: interrupted (SIGINT). {kept}; run the same command again to "
                                        f"continue (exit status {EXIT_INTERRUPTED})")
        except Terminated:
            exit_with(EXIT_TERMINATED, f"{program}: stopped (SIGTERM). {kept}; run the same command again to "
                                       f"continue (exit status {EXIT_TERMINATED})")
        except StorageError as e:
            _traceback_when_verbose(flag_values)
            _fail_on_storage(e, program, flag_values, output_flag, kept)
        except UserError as e:
            _traceback_when_verbose(flag_values)
            retryable = _retryable_storage_error(e)
            if retryable is not None:  # a reader's "cannot read" made of it: its status (75), not bad input's
                _fail_on_storage(retryable, program, flag_values, output_flag, kept)
            fail(program, e)
        except Exception as e:  # noqa: BLE001 - a bug, said to be one
            traceback.print_exc()
            reason = (str(e).strip().splitlines() or [""])[0]
            exit_with(EXIT_BUG, f"{program}: internal error: {type(e).__name__}: {reason} (a bug, not your "
                                f"input: please report it with the traceback above; exit status {EXIT_BUG})")

    try:
        app.run(guarded, flags_parser=_flags_parser(main, program, flag_values, positional, pass_on))
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say. Python would report the pipe once
        # more when it flushes stdout at exit, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


# Output flags that name one file a command writes at its end (a benchmark's figures): its place
# is tried before the work, so that a place that cannot be written is not found after an hour.
OUTPUT_FILE_FLAGS = ("output_json",)


def _check_output_files(flag_values: flags.FlagValues, output_flag: str | tuple[str, ...]) -> None:
    """Refuses, before any work, an --output_json that is a directory or whose place cannot be
    written (a file written there and removed at once; its directory made)."""
    for name in (output_flag,) if isinstance(output_flag, str) else output_flag:
        path = getattr(flag_values, name, None) if name in OUTPUT_FILE_FLAGS else None
        if not path:
            continue
        if files.isdir(path):
            raise UserError(f"--{name}={path}: a directory; expected a file's path")
        try:
            files.require_writable(path)
        except StorageError:
            raise
        except UserError as e:  # a file where its directory would be
            raise UserError(f"--{name}={path}: {e}") from None


def _retryable_storage_error(error: BaseException) -> StorageError | None:
    """The storage failure, one that the same command again may get past, that `error` was raised
    on (a refusal raised while handling it, `from None` or not); None when there is none."""
    seen = error.__context__
    while seen is not None:
        if isinstance(seen, StorageError) and seen.retry_may_help:
            return seen
        seen = seen.__context__
    return None

def _fail_on_storage(error: StorageError, program: str, flag_values: flags.FlagValues,
                     output_flag: str | tuple[str, ...], kept: str) -> NoReturn:
    """Exits with one line for what the storage refused or failed: a request to retry (status 75),
    a full disk, or a path refused (status 2)."""
    if error.retry_may_help:
        on = f" on {error.path}" if error.path and error.path not in error.reason else ""  # its words may name it
        exit_with(EXIT_TRY_AGAIN, f"{program}: the storage failed a request{on}, retried ({error.kind}: {error.reason}). "
                                  f"{kept}, and nothing half-written is taken for finished: run the same command "
                                  f"again to continue (exit status {EXIT_TRY_AGAIN})")
    names = (output_flag,) if isinstance(output_flag, str) else output_flag
    if not error.disk_full:
        flag, output = _output_holding(error.path, flag_values, names)
        if flag is None:
            fail(program, error)
        if not _within(error.path, output):  # its work, <file>.parts: what the user gave is the file
            error = error.at(output)
        refused = error.errno in (errno.EROFS, errno.EACCES, errno.EPERM) or error.kind == "PermissionDeniedError"
        fail(program, f"--{flag}: {error}" + (f"; give an --{flag} this process may write to" if refused else ""))
    where = error.path or next(
        (getattr(flag_values, name) for name in names if getattr(flag_values, name)), tempfile.gettempdir())
    fail(program, f"{where}: the disk is full ({error.reason}). {kept}; partial files were removed. Free some "
                  f"space and run the same command again to continue")


def _unknown_flag(error: flags.UnrecognizedFlagError, args: list[str]) -> str:
    """absl's refusal of a flag no command defines, naming the flagfile and line that gave it (a
    flagfile may name another) when the command line did not."""
    spellings = tuple(f"{dashes}{no}{error.flagname}" for dashes in ("--", "-") for no in ("", "no"))
    if any(arg.split("=", 1)[0] in spellings for arg in args):
        return str(error)
    found = _flagfile_line(args, lambda line: line.split("=", 1)[0] in spellings)
    if found is None:
        return str(error)
    path, number, line = found
    return f"{path}:{number}: unknown flag {line.split('=', 1)[0]} (no flag of this command has that name)"


def _unreadable_flagfile(error: flags.CantOpenFlagFileError, args: list[str]) -> str:
    """absl's refusal of a flagfile it cannot open, naming the flagfile and line that named it
    when the command line did not: its path is read from the current directory, not the flagfile's."""
    reason = str(error).split("flagfile: ", 1)[-1]
    given = {arg.split("=", 1)[1] for arg in args if arg.startswith(("--flagfile=", "-flagfile="))}
    missing = re.search(r"'([^']*)'$", reason)
    if missing and missing[1] not in given:
        found = _flagfile_line(args, lambda line: line.split("=", 1)[-1] == missing[1] and "flagfile" in line)
        if found is not None:
            return (f"{found[0]}:{found[1]}: --flagfile={missing[1]}: cannot read it ({reason}); a flagfile's path "
                    f"is read from the current directory, not from the flagfile's")
    return f"--flagfile: cannot read it ({reason})"


def _flagfile_line(args: list[str], wanted) -> tuple[str, int, str] | None:
    """(flagfile, line number, line) of the first line of the flagfiles `args` give (and those they
    name) for which wanted(line) holds, else None."""
    seen, pending = set(), [arg.split("=", 1)[1] for arg in args if arg.startswith(("--flagfile=", "-flagfile="))]
    while pending:
        path = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        try:
            with files.open_file(path) as f:
                lines = [line.strip() for line in f]
        except (OSError, UnicodeDecodeError):
            continue
        for number, line in enumerate(lines, 1):
            if wanted(line):
                return path, number, line
            if line.startswith(("--flagfile=", "-flagfile=")):
                pending.append(line.split("=", 1)[1])
    return None


def _output_holding(path: str | None, flag_values: flags.FlagValues, names: tuple[str, ...]) -> tuple[str | None, str]:
    """(the output flag, the output) whose value holds `path`: the output, in it, a parent it is
    made in, or its work (create_pretraining_files' `<file>.parts`); a value may list several
    outputs separated by commas. (None, "") when none does."""
    for name in names:
        value = getattr(flag_values, name)
        if not isinstance(value, str):
            continue
        for output in [value, *(part.strip() for part in value.split(",") if "," in value and part.strip())]:
            if _within(path, output) or _within(path, output + ".parts"):
                return name, output
    return None, ""


def _within(path: str | None, directory) -> bool:
    """Whether `path` is the directory `directory` (a flag's value), in it, or a parent that it
    would be made in."""
    if not path or not isinstance(directory, str) or not directory:
        return False
    path, directory = path.rstrip("/"), directory.rstrip("/")
    return path == directory or path.startswith(directory + "/") or directory.startswith(path + "/")


def _flags_parser(main: Callable[[list[str]], None], program: str, flag_values: flags.FlagValues, positional: bool,
                  pass_on: bool) -> Callable:
    """absl's flags parser for a command: the command's flags (`flag_values`) and absl's
    process-wide ones parsed from their defaults; --help prints the command's own flags; a bad
    flag, or an argument where the command takes none, is one line."""

    def parse(argv: list[str]) -> list[str]:
        absl_logging.use_absl_handler()  # app.run's, done the first time in a process only
        _take_process_flags(flag_values)
        unparse(flag_values)  # a command run before in this process parsed them
        if any(arg in ("-h", "-?", "--help", "--helpshort") or re.fullmatch(r"--?help(short)?=(true|1|t)", arg, re.I)
               for arg in argv[1:]):
            print_help(main, flag_values)
            sys.exit(0)
        if "--helpfull" in argv[1:]:  # absl's own exits 1: asking for help is no error
            print_help(main, flag_values)
            print(flags.FLAGS.get_help())
            sys.exit(0)
        try:
            rest = flag_values(argv, known_only=pass_on)
        except flags.UnrecognizedFlagError as e:
            fail(program, _unknown_flag(e, argv[1:]))
        except UnicodeDecodeError:  # absl reads a flagfile as text
            fail(program, "--flagfile: not UTF-8 text (a compressed or binary file?); a flagfile holds one flag a line")
        except flags.CantOpenFlagFileError as e:
            fail(program, _unreadable_flagfile(e, argv[1:]))
        except (flags.Error, ValueError) as e:  # absl's ValueError: --nojson=1 (a negated flag given a value)
            fail(program, e)
        if len(rest) > 1 and not positional and not pass_on:
            fail(program, f"unexpected argument {rest[1]!r} ({len(rest) - 1} in all): this command takes flags only. "
                          f"A glob the shell expanded? Quote it, as in --input_files='DIR/part-*.tfrecord'")
        if not flag_values["verbosity"].present:
            flag_values.verbosity = 0  # INFO, as app.run sets it (the first time in a process only)
        flags.FLAGS.mark_as_parsed()  # absl's own read theirs there: the same flags, just parsed
        return rest

    return parse


# The modules whose flags every command takes: absl's logging (--verbosity, --logtostderr, ...)
# and app (--only_check_args, --pdb, the help flags).
PROCESS_FLAG_MODULES = ("absl.logging", "absl.app")


def process_flags() -> dict[str, flags.Flag]:
    """absl's process-wide flags, by name (PROCESS_FLAG_MODULES'), in absl's global FlagValues.
    Not the flags a program that runs commands defined there itself, nor TensorFlow's."""
    app.define_help_flags()  # once per process; app.run defines them too
    return {name: flags.FLAGS[name] for name in flags.FLAGS
            if flags.FLAGS.find_module_defining_flag(name) in PROCESS_FLAG_MODULES and flags.FLAGS[name].name == name}


def _take_process_flags(flag_values: flags.FlagValues) -> None:
    """Puts absl's process-wide flags (process_flags) in the command's `flag_values`, where it
    does not define flags of their names: the same Flag objects, so that what a command line
    gives them is what absl reads."""
    for name, flag in process_flags().items():
        if name not in flag_values and (flag.short_name or name) not in flag_values:
            flag_values[name] = flag  # its short name (absl's -v) with it


def unparse(flag_values: flags.FlagValues) -> None:
    """flag_values.unparse_flags() (every flag to its default, unparsed), which logs a line: with
    no handler on the root logger, Python would give it one of its own for good (every later
    line then shown twice)."""
    root, quiet = logging.getLogger(), logging.NullHandler()
    root.addHandler(quiet)
    try:
        flag_values.unparse_flags()
    finally:
        root.removeHandler(quiet)


class _Plain(logging.Formatter):
    """A log line as a person reads it: the message, after "warning: " or "error: " when it is one."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        return message if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {message}"


class _RepeatCounter(logging.Filter):
    """Lets the first three warnings of each kind (their format string) through and counts the
    rest, for one line at the end: repeated warnings are counted, not listed."""

    SHOWN = 3

    def __init__(self):
        super().__init__()
        self.seen: collections.Counter = collections.Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        self.seen[record.msg] += 1
        return self.seen[record.msg] <= self.SHOWN

    def say_what_was_held_back(self) -> None:
        for template, count in self.seen.items():
            if count > self.SHOWN:
                # The template without its place ("%s: ") and with its values left open.
                gist = re.sub(r"%[-+ #0-9.]*[a-z]", "...", re.sub(r"^%s: ", "", str(template)))
                sys.stderr.write(f"warning: {count - self.SHOWN} more of \"{gist}\" (--verbosity=1 shows each)\n")


def _configure_output(verbosity: int) -> _RepeatCounter:
    """Plain log lines, TensorFlow's INFO lines left out, repeated warnings counted (verbosity 0)."""
    counter = _RepeatCounter()
    logging.getLogger().setLevel(logging.DEBUG if verbosity > 0 else logging.INFO)
    if verbosity > 0:
        return counter
    handler = absl_logging.get_absl_handler()
    handler.setFormatter(_Plain())
    handler.addFilter(counter)
    # TensorFlow logs its own INFO lines ("Sharding callback duration", ...) through absl's logger,
    # and tf.distribute's ("Using MirroredStrategy ...", "Collective all_reduce tensors ...")
    # through its own.
    logging.getLogger("absl").setLevel(logging.WARNING)
    tensorflow_logger = logging.getLogger("tensorflow")
    tensorflow_logger.setLevel(logging.WARNING)
    # TensorFlow loaded before absl's handler was set up (a benchmark loads it first) gave its
    # logger a handler of its own: its warnings would show twice, once in its own format.
    for own in list(tensorflow_logger.handlers):
        tensorflow_logger.removeHandler(own)
    return counter


def print_help(main: Callable, flag_values: flags.FlagValues) -> None:
    """The command's docstring, its flags by purpose when it groups them (HELP_GROUPS: {purpose:
    [flag, ...]}, with FIRST_RUN: the flags a first run sets), and all its own flags with their
    help and defaults (absl's flags left out: --helpfull lists those)."""
    command = sys.modules[main.__module__]
    print(command.__doc__.strip())
    groups, first = getattr(command, "HELP_GROUPS", {}), getattr(command, "FIRST_RUN", ())
    if groups:
        print("\nflags by purpose (* the ones a first run sets; every flag's help below):")
        for purpose, names in groups.items():
            print(textwrap.fill(", ".join(f"{'*' if name in first else ''}--{name}" for name in names), 100,
                                initial_indent=f"  {purpose}: ", subsequent_indent="    "))
    for module in flag_values.flags_by_module_dict():
        print(flag_values.module_help(module).replace(f"\n{module}:\n", "\nflags:\n", 1))


def command_flags_text(flag_values: flags.FlagValues) -> str:
    """The command's own flags (those it defined in `flag_values`, not absl's) as a flagfile
    (flags.txt), one a line, sorted."""
    own = [flag for module in flag_values.flags_by_module_dict() for flag in flag_values.get_flags_for_module(module)]
    return "".join(f"{text}\n" for text in sorted(flag.serialize() for flag in own) if text)


def _traceback_when_verbose(flag_values: flags.FlagValues) -> None:
    """With --verbosity=1 (or more), the traceback of the error being handled, above its line."""
    if flag_values.verbosity >= 1:
        traceback.print_exc()


def fail(program: str, error: Exception | str) -> NoReturn:
    """Exits with status 2 and one line naming the problem."""
    exit_with(2, f"{program}: error: {error}")


def exit_with_help(text: str) -> NoReturn:
    """Exits with status 0 after `text` on stdout, as every command's --help."""
    print(text)
    sys.exit(0)


def exit_with(status: int, line: str) -> NoReturn:
    """Exits with `status` after one line on stderr."""
    sys.stderr.write(line + "\n")
    sys.exit(status)


# A run stopped by a signal after saving: SIGTERM (a preemption) says to try again, SIGINT that
# the user stopped it.
SIGNAL_EXIT_STATUS = {"SIGTERM": EXIT_TRY_AGAIN, "SIGINT": EXIT_INTERRUPTED}


def exit_if_stopped(program: str, result) -> None:
    """Ends a training command whose run a signal stopped (training.loop's RunResult): exits with
    the signal's status and says what the same command does; returns otherwise."""
    if not result.stopped_by:
        return
    # Else a signal to another worker of its cluster (training.loop.BY_ANOTHER_WORKER) stopped it:
    # the same command goes on, as after a preemption.
    status = SIGNAL_EXIT_STATUS.get(result.stopped_by, EXIT_TRY_AGAIN)
    if not result.step:
        exit_with(status, f"{program}: stopped by {result.stopped_by} before the first step; the same command "
                          f"starts the run (exit status {status})")
    exit_with(status, f"{program}: stopped by {result.stopped_by} after saving step {result.step}; the same "
                      f"command resumes (exit status {status})")
