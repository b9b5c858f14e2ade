"""Progress lines: one per state in a log, one rewritten line on a terminal."""

import io

from bert_packed.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_each_count_once():
    log = io.StringIO()
    progress = Progress("pack: reading", total=3, unit="files", stream=log)
    for _ in range(3):
        progress.update(1)
    progress.close()
    lines = log.getvalue().splitlines()
    # The first update, then the last (the 10 s interval in between has not passed); close adds nothing.
    assert [line.split(" (")[0] for line in lines] == ["pack: reading: 1/3 files", "pack: reading: 3/3 files"]
    assert lines[0].endswith(" s left)")


def test_close_writes_a_count_not_yet_written():
    log = io.StringIO()
    progress = Progress("create", total=None, unit="shards", stream=log)
    progress.update(1)
    progress.update(1)  # within 10 s of the first line: not written
    progress.close(", 12 instances")
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == ["create: 1 shards", "create: 2 shards"]
    assert log.getvalue().splitlines()[-1].endswith(", 12 instances")


def test_a_terminal_line_is_rewritten_and_ended():
    terminal = Terminal()
    progress = Progress("train", total=2, stream=terminal)
    progress.update(1)
    progress.update(1)
    progress.close()
    text = terminal.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and "train: 2/2 items" in text
