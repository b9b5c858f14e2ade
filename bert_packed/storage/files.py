"""Where files are read and written: local paths, or any filesystem TensorFlow knows.

The path alone decides: one with a scheme (gs://, ram://, hdfs://...) goes through tf.io.gfile
(which loads TensorFlow), any other through Python's own calls. Paths are names, never patterns:
only glob() matches, so `[`, `*`, `?` and spaces in a directory name are just characters.

Files are written one way: under a temporary name, then renamed into place. Readers see either
the old file or the complete new one; an interrupted job never leaves a file that looks finished.
Temporary names are hidden (`.NAME.tmp-PID`), so no data glob (`part-*`, `*.tfrecord`) matches
one, and remove_leftovers() clears those a killed process left.

What the storage refuses or fails (a path read-only, missing or of the wrong kind, a full disk, a
bucket out of reach) is raised here as a StorageError naming the path, by every function below
and by the files open_file opens; so is it by the few places TensorFlow reads or writes files
itself, through storage(). An OSError or a TensorFlow error that reaches the command line from
elsewhere is a bug.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob as local_glob
import hashlib
import io
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile

from bert_packed.errors import OutputDirectoryError, StorageError, UserError

# A full disk, a full quota and a file-size limit all stop a write the same way.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# TensorFlow's filesystems give no errno: their words for the same three.
_DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "File too large")


def storage_error(error: BaseException, path: str | None) -> StorageError | None:
    """`error`, raised by a request to the storage on `path`, as a StorageError naming `path`
    (None: the error's own file name, if any); None when it is not an error of the storage.

    Python's OSError and TensorFlow's filesystem errors (gs://, file://...: the kinds a filesystem
    raises, and any that says the disk is full) are; a TensorFlow error of the kinds a client raises
    after its own retries failed (Unavailable, DeadlineExceeded, Aborted) is one that the same
    command again may get past. Any other TensorFlow error (out of memory, a missing kernel) is not.
    """
    if isinstance(error, StorageError):
        return error
    if isinstance(error, OSError):
        # The error's own file is what failed (the parent makedirs could not create, say), unless
        # it is a temporary name, which the user never gave.
        own = error.filename if isinstance(error.filename, str) else None
        where = own if own and not is_temporary_name(os.path.basename(own)) else path or own
        return StorageError(where, error.strerror or str(error), disk_full=error.errno in _DISK_FULL_ERRNOS,
                            kind=type(error).__name__, errno=error.errno)
    tensorflow = sys.modules.get("tensorflow")
    if tensorflow is None or not isinstance(error, tensorflow.errors.OpError):
        return None
    errors = tensorflow.errors
    transient = (errors.UnavailableError, errors.DeadlineExceededError, errors.AbortedError)
    refused = (errors.NotFoundError, errors.PermissionDeniedError, errors.UnauthenticatedError,
               errors.FailedPreconditionError, errors.AlreadyExistsError, errors.UnimplementedError)
    full = next((words for words in _DISK_FULL_WORDS if words in error.message), None)
    if full is None and not isinstance(error, transient + refused):
        return None
    reason = ([line.strip() for line in str(error.message).splitlines() if line.strip()] or [type(error).__name__])[0]
    # A filesystem's words begin with the path it was given ("file:///d/.x.tmp-12; Permission
    # denied"): the reason is what follows, the path the user's.
    named, separator, rest = reason.rpartition("; ")
    if separator and "/" in named:
        reason = rest
        path = path or (None if is_temporary_name(os.path.basename(named.strip())) else named.strip())
    return StorageError(path, full or reason, retry_may_help=isinstance(error, transient), disk_full=full is not None,
                        kind=type(error).__name__)


@contextlib.contextmanager
def storage(path: str | None):
    """In this block, what the storage raises on `path` is raised as a StorageError (storage_error)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - converted only when it is the storage's
        _raise_converted(e, path)


def _raise_converted(error: Exception, path: str | None):
    """Raises `error` as storage_error converts it, or as it is."""
    converted = storage_error(error, path)
    if converted is None or converted is error:
        raise error
    raise converted from error


def _on_storage(function):
    """function(path, ...) raising StorageError for what the storage raises (storage())."""

    @functools.wraps(function)
    def converting(path, *args, **kwargs):
        with storage(path):
            return function(path, *args, **kwargs)

    return converting


class _StorageFile:
    """A file open_file opened: what its reads and writes meet on the storage is raised as a
    StorageError naming its path. Everything else is the file's own."""

    def __init__(self, file, path: str):
        self._file, self._path = file, path

    def __getattr__(self, name: str):
        attribute = getattr(self._file, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def converting(*args, **kwargs):
            try:
                return attribute(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - converted only when it is the storage's
                _raise_converted(e, self._path)

        setattr(self, name, converting)  # made once: a corpus is read a line at a time
        return converting

    def __iter__(self):
        with storage(self._path):
            yield from self._file

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        with storage(self._path):
            self._file.close()


def _gfile(path: str):
    """tf.io.gfile for a path with a scheme; None for a local path (plain os calls)."""
    if "://" in path:
        from bert_packed.console.tensorflow_loading import import_tensorflow

        return import_tensorflow().io.gfile
    return None


@_on_storage
def open_file(path: str, mode: str = "r"):
    """Opens `path` (text modes are UTF-8).

    A remote file opened to read text is read whole and decoded here: GFile's readline takes no
    limit, and the text this package reads (corpus files of at most 32 MB, vocabularies,
    descriptions, logs) fits in memory.
    """
    opened = _open(path, mode)
    return opened if isinstance(opened, io.StringIO) else _StorageFile(opened, path)


# The first bytes of the compressed formats that corpora are shipped in.
_COMPRESSIONS = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
                 (b"PK\x03\x04", "zip"))


def compression(path: str) -> str | None:
    """The compression of the file at `path`, from its first bytes: "gzip", "bzip2", "xz", "zstd"
    or "zip"; None for any other file."""
    with open_file(path, "rb") as f:
        head = f.read(10)
    if head.startswith(b"BZh") and head[4:10] != b"1AY&SY":  # text that begins "BZh", not bzip2's block
        return None
    return next((name for magic, name in _COMPRESSIONS if head.startswith(magic)), None)


def _open(path: str, mode: str):
    gfile = _gfile(path)
    if gfile is not None:
        if "r" in mode and not gfile.exists(path):  # GFile would only fail at the first read
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if mode == "r":
            with gfile.GFile(path, "rb") as f:
                return io.StringIO(f.read().decode("utf-8"), newline=None)  # newlines as open() reads them
        return gfile.GFile(path, mode)
    if "r" in mode and not stat.S_ISREG(mode_bits := os.stat(path).st_mode) and not stat.S_ISDIR(mode_bits):
        # /dev/zero never ends, a pipe may block: no file this package reads is either
        raise OSError(errno.EINVAL, "not a regular file (a device or a pipe)", path)
    return open(path, mode, encoding=None if "b" in mode else "utf-8")


def absolute(path: str) -> str:
    """One spelling of `path`: a local path made absolute (a URI is one already)."""
    path = os.fspath(path)
    return path if "://" in path else os.path.abspath(path)


@_on_storage
def exists(path: str) -> bool:
    gfile = _gfile(path)
    return gfile.exists(path) if gfile is not None else os.path.exists(path)


@_on_storage
def size(path: str) -> int:
    """Bytes in the file at `path`."""
    gfile = _gfile(path)
    return gfile.stat(path).length if gfile is not None else os.path.getsize(path)


@_on_storage
def makedirs(path: str) -> None:
    """Creates the directory `path` (and its parents) if missing.

    Raises:
      OutputDirectoryError: `path` exists and is not a directory.
    """
    gfile = _gfile(path)
    if (gfile.exists(path) and not gfile.isdir(path)) if gfile is not None else (
            os.path.exists(path) and not os.path.isdir(path)):
        raise OutputDirectoryError(f"{path}: exists and is not a directory; expected an output directory")
    if gfile is not None:
        gfile.makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


@_on_storage
def isdir(path: str) -> bool:
    gfile = _gfile(path)
    return gfile.isdir(path) if gfile is not None else os.path.isdir(path)


@_on_storage
def isfile(path: str) -> bool:
    """Whether `path` is a regular file: not a directory, nor a device or a pipe (which never end,
    or block the reader)."""
    gfile = _gfile(path)
    if gfile is not None:
        return gfile.exists(path) and not gfile.isdir(path)
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


@_on_storage
def listdir(path: str) -> list[str]:
    """The names in the directory `path`, sorted ([] when it does not exist)."""
    if not exists(path):
        return []
    gfile = _gfile(path)
    return sorted(name.rstrip("/") for name in (gfile.listdir(path) if gfile is not None else os.listdir(path)))


@_on_storage
def glob(pattern: str) -> list[str]:
    """The paths matching `pattern`, sorted.

    The longest leading part of `pattern` that names an existing path is taken as it is, not as
    a pattern: `runs/g [1]/part-*` matches the parts in the directory `runs/g [1]`, and a file
    named `a[1].tfrecord` matches itself.
    """
    gfile = _gfile(pattern)
    parts = pattern.split("/")
    for end in range(len(parts), 0, -1):
        literal = "/".join(parts[:end])
        if literal and local_glob.has_magic(literal) and exists(literal):
            pattern = "/".join([local_glob.escape(literal)] + parts[end:])
            break
    return sorted(gfile.glob(pattern) if gfile is not None else local_glob.glob(pattern))


@_on_storage
def rmtree(path: str) -> None:
    """Removes the directory `path` and everything in it, if it exists."""
    gfile = _gfile(path)
    if gfile is not None:
        if gfile.exists(path):
            gfile.rmtree(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


@_on_storage
def remove(path: str) -> None:
    gfile = _gfile(path)
    if gfile is not None:
        gfile.remove(path)
    else:
        os.remove(path)


def move(source: str, destination: str) -> None:
    """Renames `source` to `destination`, replacing it: the last step of every write here."""
    gfile = _gfile(source)
    with storage(destination):
        if gfile is not None:
            gfile.rename(source, destination, overwrite=True)
        else:
            os.replace(source, destination)


# A temporary name, with its writer's pid: temporary_name()'s (`.NAME.tmp-PID`, hidden) or that of a
# lock being written by exclusive() (`LOCK.tmp-PID`: visible for compare_curves's `OUTPUT.lock`).
_TEMPORARY = re.compile(r"^.+\.tmp-(\d+)$")


def temporary_name(path: str) -> str:
    """Where `path` is written before it is renamed into place: `.NAME.tmp-PID` beside it."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def is_temporary_name(name: str) -> bool:
    """Whether `name` is a file being written (or left by a writer killed midway)."""
    return bool(_TEMPORARY.match(name))


def remove_leftovers(directory: str, of: str | None = None) -> list[str]:
    """Removes the temporary files that writers killed midway left in `directory` (only those of
    the file named `of`, when given: a directory that is not the command's own).

    A temporary file whose writer still runs (this process, or another live one on this host) is
    kept; on a remote filesystem, where that cannot be told, only this process's are kept. Call
    it holding the directory's lock (exclusive), so that no other writer starts meanwhile.

    Returns:
      The names removed.
    """
    removed = []
    for name in listdir(directory):
        match = _TEMPORARY.match(name)
        if not match or name.startswith(".lock") or (of is not None and not name.startswith(f".{of}.tmp-")):
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or ("://" not in directory and still_running({"host": socket.gethostname(), "pid": pid})):
            continue
        path = os.path.join(directory, name)
        rmtree(path) if isdir(path) else remove(path)
        removed.append(name)
    return removed


@contextlib.contextmanager
def unglobbed(prefix: str):
    """Yields a path naming the files `prefix`.* that holds no glob character.

    TensorFlow's checkpoint reader matches its path as a pattern, so a checkpoint under
    `runs/g [1]/` cannot be read through its own name. Here its files are linked, under a plain
    name, into a temporary directory for as long as the block runs (local paths; a remote path
    with such characters is refused in one line).
    """
    if not local_glob.has_magic(prefix):
        yield prefix
        return
    if "://" in prefix:
        raise UserError(f"{prefix}: TensorFlow cannot read a checkpoint whose remote path holds [, ], *, ? or {{; "
                        f"copy it to a plain path")
    directory, name = os.path.split(os.path.abspath(prefix))
    with tempfile.TemporaryDirectory(prefix="bert_packed-") as plain:
        for entry in listdir(directory):
            if entry.startswith(name + "."):
                os.symlink(os.path.join(directory, entry), os.path.join(plain, "checkpoint" + entry[len(name):]))
        yield os.path.join(plain, "checkpoint")


@contextlib.contextmanager
def atomic_path(path: str):
    """Yields a temporary path next to `path`; renames it to `path` only if the block succeeds.

    On any error (or an interrupt) the temporary file is removed and `path` is left as it was.
    """
    tmp = temporary_name(path)
    try:
        yield tmp
        move(tmp, path)
    finally:
        if exists(tmp):
            remove(tmp)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w"):
    """Opens a temporary file next to `path` for writing; on success it is flushed to disk and
    renamed to `path` (see atomic_path)."""
    with atomic_path(path) as tmp:
        with storage(path):  # the user's path named, not the temporary name beside it
            opened = _open(tmp, mode)
        with _StorageFile(opened, path) as f:
            yield f
            f.flush()
            if hasattr(f, "fileno"):
                with storage(path):
                    os.fsync(f.fileno())


def local_stand_in(path: str) -> str:
    """A local path named after a remote one (in the temporary directory): what a bucket cannot
    do (lock, append, map into memory) is done there, and found again by the same command."""
    return os.path.join(tempfile.gettempdir(), "bert_packed-" + hashlib.sha256(path.encode()).hexdigest()[:16]
                        + "-" + os.path.basename(path.rstrip("/")))


def read_json_object(path: str) -> dict:
    """The JSON object in the file at `path`.

    Raises:
      ValueError: the file is not JSON, or not an object (the reason, for the caller's message).
      StorageError: the storage refused it.
    """
    with open_file(path) as f:
        try:
            value = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def require_writable(path: str) -> None:
    """Refuses, before any work, a file's path that cannot be written: its directory made, then a
    file written beside it and removed at once. Raises OutputDirectoryError (a file where its
    directory would be), or the StorageError naming `path`, not the file beside it."""
    makedirs(os.path.dirname(absolute(path)))
    probe = temporary_name(path)
    try:
        with open_file(probe, "w") as f:
            f.write("")  # a bucket's writer makes its file on the first write
    except StorageError as e:
        raise e.at(path) from None
    remove(probe)


def write_text_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename."""
    with atomic_open(path) as f:
        f.write(text)


@_on_storage
def other_than_a_file(path: str) -> bool:
    """Whether `path` exists and is no regular file, asked once: `exists and not isfile` would
    call a lock released between the two questions unreadable."""
    gfile = _gfile(path)
    if gfile is not None:
        return gfile.isdir(path)
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def this_process() -> dict:
    """This process as still_running tells it apart from a later one given its pid."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid())}


def still_running(holder: dict) -> bool:
    """Whether the process of `holder` (this_process()'s, or a lock's holder) still runs: on
    another host, it is taken to."""
    if not holder:
        return False
    if holder.get("host") != socket.gethostname():
        return True  # another machine's process: cannot tell, so it holds
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError, OverflowError):
        return True
    recorded = holder.get("process_start")
    start = _process_start(int(holder["pid"]))
    # A zombie (killed, not yet reaped: for good under a container's pid 1 that reaps nothing) holds nothing.
    return start != "zombie" and (recorded is None or start in (None, recorded))


def _process_start(pid: int) -> str | None:
    """When process `pid` started, as this host's kernel tells it (boot id and clock ticks since
    boot; None where /proc does not say): a pid used again by another process starts later.
    "zombie" for a process that has ended but not been reaped."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return "zombie" if fields[0] == "Z" else f"{boot}:{fields[19]}"
    except (OSError, IndexError):
        return None
