"""The errors a user can cause and fix: bad input files, flags, settings or output directories.

Every such error derives from `UserError`. The command line (bert_packed.cli.common.run) prints
it as one line, `<program>: error: <message>`, and exits with status 2; any other exception is a
bug and keeps its traceback. A message names the file, record or flag and what was expected.
"""

from __future__ import annotations


class UserError(Exception):
    """An error in what the user gave: one line at the command line, exit status 2."""


class SettingsError(UserError, ValueError):
    """A setting (a flag or an argument) has a value the code does not support."""


class InputFilesError(UserError, FileNotFoundError):
    """Input files are missing: a glob that matches nothing, or no files at all."""


class OutputDirectoryError(UserError):
    """The output directory holds another run, or output of another kind."""


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (a NaN or Inf loss, say); the last good checkpoint is kept."""
