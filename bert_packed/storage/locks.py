"""Locks on output directories: one process at a time writes a run, a dataset or an export.

A lock is a file naming its holder (command, host, pid, start), written whole and hard-linked
into place, so that two processes never both hold it; one left by a process that no longer runs
is taken over (exclusive).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time

from bert_packed.errors import StorageError, UserError
from bert_packed.storage.files import (
    local_stand_in,
    open_file,
    other_than_a_file,
    remove,
    still_running,
    storage,
    this_process,
    write_text_atomically,
)


class DirectoryLockedError(UserError):
    """Another live process holds the output directory."""


@contextlib.contextmanager
def exclusive(lock_path: str, what: str):
    """Holds an exclusive lock, the file `lock_path`, for the block; refuses a live holder.

    The lock file is written whole under a temporary name and hard-linked into place, which
    fails when it exists: two processes can never both hold it, and a holder is always named.
    A lock left by a process that no longer runs (same host, and the pid gone or now another
    process's: a container's pid 1 after a restart, say) is taken over, through a rename only one
    taker can win.

    A bucket has no exclusive create, so a remote `lock_path` is two things: a local file named
    after it (local_stand_in), which keeps two processes on this host apart as above, and a claim
    written to `lock_path` itself, which a process on another host finds and is refused by (it
    cannot tell whether that holder still runs: the message says to remove the claim if not). Two
    hosts that start at the same moment may both write a claim; the one whose claim was replaced
    finds out when it calls the yielded `confirm`, before it commits its output.

    Args:
      lock_path: the lock file (a directory's `.lock`, say).
      what: the command, recorded for whoever finds the lock held.

    Yields:
      confirm(): raises DirectoryLockedError when another process's claim replaced this one's.

    Raises:
      DirectoryLockedError: naming the holder (command, host, pid, start time).
    """
    holder = {"command": what, **this_process(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "claim": os.urandom(8).hex()}
    where = os.path.dirname(lock_path) or "."
    if "://" not in lock_path:
        with _locked(lock_path, holder, where):
            yield lambda: None
        return
    with _locked(local_stand_in(lock_path), holder, where), _claimed(lock_path, holder) as confirm:
        yield confirm


@contextlib.contextmanager
def _locked(lock_path: str, holder: dict, where: str):
    """The local lock of exclusive() on `where`: `lock_path` holds `holder` for the block. What
    the storage refuses names `where` (the output the user gave), not the lock's hidden files."""
    tmp = f"{lock_path}.tmp-{os.getpid()}"
    try:
        with storage(where), open(tmp, "w", encoding="utf-8") as f:
            json.dump(holder, f)
        while True:
            try:
                with storage(where):
                    os.link(tmp, lock_path)
                break
            except StorageError as e:
                if e.errno != errno.EEXIST:
                    raise
                current = _lock_holder(lock_path)
                if current == {}:
                    continue  # released between the two: try again
                if current is None or still_running(current):
                    raise DirectoryLockedError(_held_message(where, lock_path, current)) from None
                with storage(where):
                    _remove_stale(lock_path, current)
    finally:
        with contextlib.suppress(OSError):  # not written: the directory refused it
            os.remove(tmp)
    try:
        yield
    finally:
        if _lock_holder(lock_path) == holder:
            os.remove(lock_path)


def _remove_stale(lock_path: str, stale: dict) -> None:
    """Removes `lock_path` if it still names `stale`, a holder that no longer runs. Takers of a
    stale lock go one at a time (an flock on its directory, which the kernel releases when a
    taker dies): two that both saw the dead holder could otherwise remove each other's new lock.
    Holders never take it, so taking the lock and releasing it cost nothing more."""
    try:
        directory = os.open(os.path.dirname(os.path.abspath(lock_path)), os.O_RDONLY)
    except PermissionError:  # a directory one may write but not list: takers race, as they did before
        directory = None
    try:
        if directory is not None:
            fcntl.flock(directory, fcntl.LOCK_EX)
        if _lock_holder(lock_path) == stale:
            os.remove(lock_path)
    finally:
        if directory is not None:
            os.close(directory)  # releases the flock


@contextlib.contextmanager
def _claimed(claim_path: str, holder: dict):
    """The claim of exclusive() on a bucket: `claim_path` names `holder` for the block. A claim
    of this host's process that no longer runs is replaced; any other refuses."""
    current = _lock_holder(claim_path)
    if current is None or (current and still_running(current)):
        raise DirectoryLockedError(_held_message(os.path.dirname(claim_path), claim_path, current))

    def confirm() -> None:
        now = _lock_holder(claim_path)
        if now != holder:
            raise DirectoryLockedError(
                f"{os.path.dirname(claim_path)}: another process claimed it during this run ("
                f"{_holder_words(now) if now else 'its claim ' + claim_path + ' is gone'}); its files and this "
                f"run's may be mixed: nothing was committed. Let one command finish, then run it again")

    try:
        write_text_atomically(claim_path, json.dumps(holder))
    except StorageError as e:
        raise e.at(os.path.dirname(claim_path)) from e  # the output the user gave, not its claim file
    confirm()
    try:
        yield confirm
    finally:
        if _lock_holder(claim_path) == holder:
            remove(claim_path)


def _lock_holder(lock_path: str) -> dict | None:
    """The holder a lock (or a claim) names; {} when there is none, None when it cannot be read."""
    if other_than_a_file(lock_path):
        return None  # a directory, say: nobody's lock, and nothing to take over
    try:
        with open_file(lock_path) as f:
            holder = json.load(f)
    except StorageError as e:
        return {} if e.errno == errno.ENOENT else None  # released meanwhile: try again
    except ValueError:
        return None
    return holder if isinstance(holder, dict) and holder else None


def _held_message(where: str, lock_path: str, holder: dict | None) -> str:
    if holder is None:
        return f"{where}: locked by {lock_path}, which cannot be read; remove it if no process uses {where}"
    return (f"{where}: in use by {_holder_words(holder)}; wait for it to finish, or use another directory (if that "
            f"process no longer runs, on a machine or in a container gone since, remove {lock_path})")


def _holder_words(holder: dict) -> str:
    return (f"{holder.get('command', 'a process')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, since "
            f"{holder.get('started', '?')})")
