"""A progress line for long jobs: done / total, rate and time left, at most twice a second."""

from __future__ import annotations

import sys
import time


class Progress:
    """Prints `label: done/total unit (rate/s, eta)` to stderr; one line per update when not a tty.

    Attributes:
      label: what is being done.
      total: the amount of work (None when unknown).
      unit: what is counted.
    """

    def __init__(self, label: str, total: int | None = None, unit: str = "items", stream=None):
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._stream = stream or sys.stderr
        self._start = time.perf_counter()
        self._last = 0.0
        self._tty = getattr(self._stream, "isatty", lambda: False)()
        self._printed = None  # the count of the last line written
        self._first = None  # (clock, count) at the first line: the time left is timed from there

    def update(self, amount: int = 1, extra: str = "") -> None:
        self.done += amount
        now = time.perf_counter()
        if now - self._last >= (0.5 if self._tty else 10.0) or (self.total and self.done >= self.total):
            self._last = now
            self._print(extra)

    def close(self) -> None:
        """The final line: on a terminal it ends the line kept rewritten; in a log it is written
        only when the last line written does not already say this count."""
        if self._tty:
            self._print("")
            self._stream.write("\n")
        elif self._printed != self.done:
            self._print("")

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._start

    @property
    def rate(self) -> float:
        return self.done / max(self.seconds, 1e-9)

    def _print(self, extra: str) -> None:
        total = f"/{self.total:,}" if self.total else ""
        now, eta = time.perf_counter(), ""
        if self._first is None:
            self._first = (now, self.done)
        # Timed from the first count on: work started together in parallel ends together at first.
        first_time, first_done = self._first
        if self.total and first_done < self.done < self.total and now > first_time:
            eta = f", about {duration((self.total - self.done) * (now - first_time) / (self.done - first_done))} left"
        rate = f"{self.rate:.2g}" if self.rate < 10 else f"{self.rate:,.0f}"
        text = f"{self.label}: {self.done:,}{total} {self.unit} ({rate}/s{eta}){extra}"
        self._stream.write(("\r" + text + "\033[K") if self._tty else text + "\n")
        self._stream.flush()
        self._printed = self.done


def duration(seconds: float) -> str:
    """Seconds in the unit a person reads: "45 s", "12 min", "3.4 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
