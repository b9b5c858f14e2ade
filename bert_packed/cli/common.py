"""What every command shares: how it starts, how it fails, how it finds its input files.

`run` is the one way a command runs: --help prints the command's own flags and exits 0; absl
parses the flags (flagfiles included), and then
- a bad flag, or a UserError raised anywhere below (bert_packed.errors), prints one line,
  `<program>: error: <message>`, and exits with status 2;
- the filesystem refusing a path (read-only, no permission, a symlink loop, a file gone) prints
  one line naming the path, status 2;
- a full disk (or quota, or file-size limit) prints one line saying what is kept, status 2;
- Ctrl-C (SIGINT) outside a loop that handles it prints one line saying what is kept, status 130;
- any other exception is a bug and raises with its traceback;
- a closed pipe on stdout (`| head`) ends the command quietly.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags

from bert_packed import files
from bert_packed.errors import InputFilesError, UserError

# What TensorFlow writes to stderr while it loads, before any of its logging settings apply: the
# absl notice, the oneDNN and CPU-feature notices, and on machines with CUDA libraries the
# factory-registration complaints. Other lines, errors included, pass.
_TENSORFLOW_STARTUP = re.compile(r"^(WARNING: All log messages before absl::InitializeLog|[IW]\d{4} |To enable the "
                                 r"following instructions:|TF-TRT Warning|E\d{4} .*(Unable to register|already "
                                 r"been registered))")

# Interrupted by SIGINT (Ctrl-C): the shell's 128 + 2.
EXIT_INTERRUPTED = 130
# The filesystem refusing a path: read-only, no permission, a symlink loop, a file gone or in the way.
_REFUSED_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ELOOP, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                   errno.ENAMETOOLONG)
_REFUSED_TEXTS = ("Permission denied", "Read-only file system", "Too many levels of symbolic links")
# A full disk, a full quota and a file-size limit all stop a write the same way.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large")


def import_tensorflow(verbosity: int) -> None:
    """Loads TensorFlow quietly unless --verbosity is above 0.

    Quiet: TF_CPP_MIN_LOG_LEVEL=2 (unless set), and what TensorFlow writes straight to file
    descriptor 2 while it loads goes through a pipe, where a thread passes on every line but the
    start-up notices as it comes (so an error just before a crash still shows).
    """
    if verbosity > 0 or "tensorflow" in sys.modules:
        import tensorflow  # noqa: F401
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    stderr = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pass_on():
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if not _TENSORFLOW_STARTUP.match(line.decode("utf-8", "replace")):
                    os.write(stderr, line)

    thread = threading.Thread(target=pass_on, daemon=True)
    thread.start()
    try:
        import tensorflow  # noqa: F401
    finally:
        os.dup2(stderr, 2)  # the pipe's last writer closes: the thread reads to its end and stops
        thread.join()
        os.close(stderr)


def run(main: Callable[[list[str]], None], program: str, output_flag: str | tuple[str, ...], kept: str) -> None:
    """Parses the flags and runs main(argv) (argv: the program and its positional arguments).

    Args:
      main: the command's body.
      program: the command's name, for messages.
      output_flag: the flag naming where the command writes (the first given, of several), for the
        full-disk message.
      kept: what survives a full disk, for the message ("Finished shards are kept", say).
    """

    def parse(argv: list[str]) -> list[str]:
        if any(arg in ("-h", "--help", "--helpshort") for arg in argv[1:]):
            print_help(main)
            sys.exit(0)
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            fail(program, e)

    def guarded(argv: list[str]) -> None:
        try:
            main(argv)
        except KeyboardInterrupt:
            exit_with(EXIT_INTERRUPTED, f"{program}: interrupted (SIGINT). {kept}; run the same command again to "
                                        f"continue (exit status {EXIT_INTERRUPTED})")
        except UserError as e:
            fail(program, e)
        except Exception as e:  # noqa: BLE001 - TensorFlow reports a full disk as its own error types
            if refused_by_the_filesystem(e):
                where = getattr(e, "filename", None)
                reason = getattr(e, "strerror", None) or str(e).strip().splitlines()[0]
                fail(program, f"{where}: {reason}" if where else reason)
            if not is_disk_full(e):
                raise
            names = (output_flag,) if isinstance(output_flag, str) else output_flag
            where = getattr(e, "filename", None) or next(
                (getattr(flags.FLAGS, name) for name in names if getattr(flags.FLAGS, name)), names[0])
            reason = getattr(e, "strerror", None) or next(text for text in _DISK_FULL_TEXTS if text in str(e))
            fail(program, f"{where}: the disk is full ({reason}). {kept}; partial files were removed. Free some "
                          f"space and run the same command again to continue")

    try:
        app.run(guarded, flags_parser=parse)
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say. Python would report the pipe once
        # more when it flushes stdout at exit, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def print_help(main: Callable) -> None:
    """The command's docstring and its own flags with their defaults (absl's flags left out:
    --helpfull lists those)."""
    print(sys.modules[main.__module__].__doc__.strip())
    for module in _command_modules():
        print(flags.FLAGS.module_help(module).replace(f"\n{module}:\n", "\nflags:\n", 1))


def _command_modules() -> list[str]:
    """The modules that define the running command's flags (absl and TensorFlow define others)."""
    return [module for module in flags.FLAGS.flags_by_module_dict()
            if module.startswith("bert_packed.") or module == sys.argv[0]]


def command_flags_text() -> str:
    """The command's own flags as a flagfile (flags.txt), one a line, sorted."""
    own = [flag for module in _command_modules() for flag in flags.FLAGS.get_flags_for_module(module)]
    return "".join(f"{text}\n" for text in sorted(flag.serialize() for flag in own) if text)


def fail(program: str, error: Exception | str) -> NoReturn:
    """Exits with status 2 and one line naming the problem."""
    exit_with(2, f"{program}: error: {error}")


def exit_with(status: int, line: str) -> NoReturn:
    """Exits with `status` after one line on stderr."""
    sys.stderr.write(line + "\n")
    sys.exit(status)


def refused_by_the_filesystem(error: BaseException) -> bool:
    """Whether `error` is the filesystem refusing a path (read-only, no permission, a symlink
    loop, gone), as Python or TensorFlow words it: the user's to fix, said in one line."""
    if isinstance(error, OSError) and error.errno in _REFUSED_ERRNOS and error.filename:
        return True
    return type(error).__module__.startswith("tensorflow") and any(text in str(error) for text in _REFUSED_TEXTS)


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` (an OSError, or TensorFlow's wording of one) says the disk is full."""
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
        return True
    return any(text in str(error) for text in _DISK_FULL_TEXTS)


def expand_globs(patterns: str | list[str], what: str) -> list[str]:
    """Comma-separated globs (or a list of them) -> sorted files; every pattern must match.

    Raises:
      InputFilesError: naming the pattern that matches nothing.
    """
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    if not patterns:
        raise InputFilesError(f"{what}: no files given")
    found = []
    for pattern in patterns:
        try:
            matches = files.glob(pattern.strip())
        except Exception as e:  # noqa: BLE001 - a filesystem's own errors: no credentials, unknown scheme
            raise InputFilesError(f"{what}: {pattern!r}: {str(e).splitlines()[0]}") from None
        if not matches:
            raise InputFilesError(f"{what}: {pattern!r} matches no file")
        found.extend(matches)
    return found
