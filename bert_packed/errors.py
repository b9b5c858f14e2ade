"""The errors a command ends on, each converted where it happens, so that the command line
(bert_packed.cli.common.run) tells them apart by class alone:

- `UserError`: what the user gave (bad input files, flags, settings or output directories): one
  line, `<program>: error: <message>`, exit status 2. A message names the file, record or flag
  and what was expected.
- `StorageError` (a UserError): the storage refused a path (read-only, no permission, gone, a
  full disk), raised by bert_packed.storage.files and the few places TensorFlow reads or writes itself;
  one line naming the path, exit status 2, or 75 when the same command again may go on (a
  request the storage still failed after retrying).
- `InternalError`, and any other exception: a bug, with its traceback, exit status 1.
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


class StorageError(UserError, OSError):
    """The storage refused or failed a request on a path. An OSError too (`errno`, `strerror`,
    `filename`), so that a caller that reads a file and says why it could not goes on as it is.

    Attributes:
      path: the path as the user gave it (None when the storage did not say which).
      reason: the storage's own words ("Permission denied").
      retry_may_help: the storage still failed after its client's own retries (a bucket out of
        reach, a deadline passed): neither the input nor a bug; the same command again goes on.
      disk_full: the disk (or a quota, or a file-size limit) is full.
      kind: the class of the error the storage raised, for the message.
    """

    def __init__(self, path: str | None, reason: str, retry_may_help: bool = False, disk_full: bool = False,
                 kind: str = "OSError", errno: int | None = None):
        OSError.__init__(self, errno, reason, path)
        self.path, self.reason, self.retry_may_help, self.disk_full, self.kind = (
            path, reason, retry_may_help, disk_full, kind)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason

    def at(self, path: str) -> StorageError:
        """The same error, naming `path` (what the user gave, where a hidden file of it failed)."""
        return StorageError(path, self.reason, self.retry_may_help, self.disk_full, self.kind, self.errno)


def raise_if_retryable(error: BaseException) -> None:
    """Raises `error` again when it is a StorageError that a retry may get past: a handler that
    words the storage's refusals as its own user error (exit 2) keeps exit 75 for those."""
    if isinstance(error, StorageError) and error.retry_may_help:
        raise error


class InternalError(RuntimeError):
    """A check of the code's own state failed: a bug, not the user's input (traceback, exit 1)."""
