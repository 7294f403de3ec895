"""``ledgerctl``'s progress bars: amount done, rate and time left, on a terminal only.

A bar (tqdm's) is drawn on stderr when stderr is a terminal and the transfer is large
enough to be worth one; otherwise nothing at all is written, so scripts and pipes see
exactly the command's output. It owns no transfer: commands call it with what they did.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

BYTES_MIN = 8 * 1024 * 1024
"""A transfer of fewer bytes than this never shows a bar."""
ENTRIES_MIN = 1000
"""Nor a transfer of fewer entries than this."""


class Progress:
    """Called with (done, total or None) as a transfer goes; ``close`` ends the bar.

    The bar appears once the transfer (its total, or while the total is unknown, what
    is done) reaches ``minimum``; without a total it shows the amount and the rate.
    """

    def __init__(
        self,
        label: str,
        unit: str = "B",
        minimum: int = BYTES_MIN,
        stream: TextIO | None = None,
    ) -> None:
        self.label, self.unit, self.minimum = label, unit, minimum
        self.stream = stream or sys.stderr
        self.active = self.stream.isatty()
        self.bar: tqdm[Any] | None = None
        self.postfix = ""

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.active:
            return
        bar = self.bar
        if bar is None:
            if (total if total is not None else done) < self.minimum:
                return
            from tqdm import tqdm  # only on a terminal: ledgerctl starts faster without it

            cols, rows = _size(self.stream)
            bar = tqdm(
                desc=self.label,
                total=total,
                unit=self.unit if self.unit == "B" else f" {self.unit}",
                unit_scale=self.unit == "B",
                unit_divisor=1024,
                file=self.stream,
                mininterval=0.1,
                ncols=cols,
                nrows=rows,
            )
            self.bar = bar
        if total is not None and bar.total != total:
            bar.total = total
        if self.postfix:
            bar.set_postfix_str(self.postfix, refresh=False)
        bar.update(done - bar.n)

    def write(self, text: str) -> None:
        """A line on the stream, above the bar when one is drawn."""
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _size(stream: TextIO) -> tuple[int, int]:
    """The terminal's size, 80x24 where it reports none (a new pseudo-terminal reports 0x0,
    and tqdm draws nothing in 0 rows)."""
    try:
        cols, rows = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError):
        cols = rows = 0
    return cols or 80, rows or 24
