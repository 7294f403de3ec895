"""The shell examples of the README and of ``docs/``: each ``sh`` block marked
``<!-- example: shell -->`` runs against a real daemon, and prints what it shows.

How a marked block reads:

* A line starting with ``$ `` is a command. It goes on over the next lines while bash
  would (a line ending with ``\\``, a quote still open). A ``# comment`` after a command
  is bash's own.
* The lines after a command, up to the next ``$ ``, are what it prints: standard output
  and standard error together, as a terminal shows them. Nothing after a command: it
  prints nothing.
* Every command must exit 0, unless the command after it is ``echo $?``, which prints
  its status (so ``$ echo $?`` then ``4`` shows, and checks, a refusal's exit status).

How a command's output is compared with the lines shown (so that ids, revisions and
times, which change from run to run, can be shown):

* ``…`` (one character, U+2026) stands for any text within a line, none included:
  ``ann	01…`` matches a line with any revision.
* A line that is only ``...`` stands for any number of lines, none included.
* A note: two or more blanks, ``#`` and a blank, to the end of the line, is left out
  (``by_city	building   # or ready``), of what a command prints too (so ``--help``'s
  examples, which have notes, can be shown).
* A run of blanks (spaces or tabs) matches any run of blanks, so a tab may be shown as
  spaces; blanks at the ends of lines, and empty lines at the end, are left out.

The commands of a block run one after the other in one ``bash`` (so a variable set by
one is there for the next), in a fresh directory, against a fresh daemon (the
``daemon`` fixture): ``ledgerctl`` and ``ledgerd`` are on ``PATH`` (this Python's), and
``$LEDGERD_SOCKET`` and ``$SOCK`` name the daemon's socket, ``$COLUMNS`` is 80 (help
text is wrapped to it). What a block leaves running in the background is ended with it.
A block that runs ``curl`` or ``jq`` is skipped, saying so, where that is not installed.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemon.conftest import Daemon

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "<!-- example: shell -->"
_MARKED = re.compile(re.escape(MARKER) + r"\n```sh\n(.*?)\n```", re.DOTALL)
_NOTE = re.compile(r"[ \t]{2,}#[ \t].*$")
_BLANKS = re.compile(r"[ \t]+")
_ANY_LINES = "..."
_ANY_TEXT = "…"
TOOLS = ("curl", "jq")
"""Commands an example may run that are not everywhere: without one, it is skipped."""


@dataclass(frozen=True)
class Step:
    """A command of an example and the lines shown after it."""

    command: str
    expected: list[str]


def parse(block: str) -> list[Step]:
    """The steps of a marked block (its text between the fences)."""
    steps: list[Step] = []
    lines = block.splitlines()
    i = 0
    if lines and not lines[0].startswith("$ "):
        raise ValueError(f"a shell example starts with output, not a command: {lines[0]!r}")
    while i < len(lines):
        command = [lines[i][2:]]
        while i + 1 < len(lines) and _incomplete("\n".join(command)):
            i += 1
            command.append(lines[i])
        i += 1
        expected: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        while expected and not expected[-1].strip():
            expected.pop()
        steps.append(Step("\n".join(command), expected))
    return steps


def _incomplete(command: str) -> bool:
    """Whether bash reads ``command`` as a command that goes on over the next line."""
    if command.endswith("\\"):
        return True
    checked = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    return (
        checked.returncode != 0
        and re.search(r"unexpected (EOF|end of file)", checked.stderr) is not None
    )


def _line_pattern(line: str) -> str:
    line = _NOTE.sub("", line).rstrip()
    parts = []
    for text in line.split(_ANY_TEXT):
        parts.append("[ \t]+".join(re.escape(word) for word in _BLANKS.split(text)))
    return "[^\n]*".join(parts)


def matches(expected: list[str], output: str) -> bool:
    """Whether ``output`` is what ``expected`` shows, by the rules above."""
    pattern = "".join(
        "(?:[^\n]*\n)*" if line.strip() == _ANY_LINES else _line_pattern(line) + "\n"
        for line in expected
    )
    return re.fullmatch(pattern, _normal(output)) is not None


def _normal(output: str) -> str:
    lines = [_NOTE.sub("", line).rstrip() for line in output.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "".join(line + "\n" for line in lines)


def script(steps: list[Step]) -> str:
    """One bash script running the steps, each followed by a NUL, its exit status and a
    NUL on standard output (and ``$?`` set back to that status for the next step)."""
    out = ["exec 2>&1"]
    for step in steps:
        out.append(step.command)
        out.append("__status=$?; printf '\\0%s\\0' \"$__status\"; (exit $__status)")
    return "\n".join(out) + "\n"


def missing_tool(block: str, which: Callable[[str], str | None] = shutil.which) -> str | None:
    """A command of ``TOOLS`` that ``block`` runs and that is not installed, if any."""
    for tool in TOOLS:
        if re.search(rf"\b{tool}\b", block) and which(tool) is None:
            return tool
    return None


def _run(text: str, cwd: Path, env: dict[str, str]) -> tuple[str, int]:
    """Run a script in a session of its own; whatever it left running in the background
    (an example may start a daemon of its own) is ended with it."""
    proc = subprocess.Popen(
        ["bash", "-c", text],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        stdout, _ = proc.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return stdout.decode(errors="replace"), proc.returncode


def examples_in(source: Path) -> list[str]:
    return _MARKED.findall(source.read_text())


def examples() -> list[tuple[str, str]]:
    return [
        (str(source.relative_to(ROOT)), block)
        for source in SOURCES
        for block in examples_in(source)
    ]


def test_every_marker_is_before_a_shell_block_of_commands() -> None:
    for source in SOURCES:
        assert source.read_text().count(MARKER) == len(examples_in(source)), (
            f"{source.name}: a {MARKER} marker is not before a ```sh block"
        )
    for where, block in examples():
        assert parse(block), f"{where}: an empty shell example"


def test_the_rules_of_expected_output() -> None:
    """The comparison the module's docstring describes, on small cases."""
    assert matches(["ann\t01…"], "ann 01M97W7231WZQ09CZK091E7J64\n")
    assert matches(["ann     01…   # _id, _rev"], "ann\t01M97W72\n\n")
    assert not matches(["ann\t01…"], "bob\t01M97W72\n")
    assert matches(["usage: ledgerctl …", "..."], "usage: ledgerctl [-h]\n  a\n  b\n")
    assert matches(["a", "...", "z"], "a\nz\n") and matches(["a", "...", "z"], "a\nb\nz\n")
    assert not matches(["a"], "a\nb\n") and not matches([], "a\n") and matches([], "\n")
    assert matches(['{"a": …}'], '{"a": 1, "b": [2]}')
    steps = parse("$ a \\\n   --b\nout\n$ echo $?\n0\n")
    assert steps == [Step("a \\\n   --b", ["out"]), Step("echo $?", ["0"])]
    assert missing_tool("$ curl -s x | jq .a", which=lambda tool: None) == "curl"
    assert missing_tool("$ curl -s x | jq .a", which=lambda t: None if t == "jq" else t) == "jq"
    assert missing_tool("$ ledgerctl ls notes inbox", which=lambda tool: None) is None
    steps = parse("$ a '{\n  b}'\n$ c\n")
    assert steps == [Step("a '{\n  b}'", []), Step("c", [])]


@pytest.mark.parametrize(
    ("source", "block"), examples(), ids=[f"{s}-{n}" for n, (s, _) in enumerate(examples())]
)
def test_shell_example_runs(source: str, block: str, daemon: Daemon, tmp_path: Path) -> None:
    steps = parse(block)
    tool = missing_tool(block)
    if tool is not None:
        pytest.skip(f"{source}: the example runs {tool}, which is not installed here")
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "LEDGERD_SOCKET": str(daemon.socket),
        "SOCK": str(daemon.socket),
        "COLUMNS": "80",
    }
    for var in ("LEDGERD_CONFIG", "LEDGERD_DATA_DIR", "LEDGERD_CLOUD"):
        env.pop(var, None)
    stdout, returncode = _run(script(steps), tmp_path, env)
    parts = stdout.split("\0")
    outputs, statuses = parts[0:-1:2], parts[1::2]
    assert len(statuses) == len(steps), (
        f"{source}: the example stopped after {len(statuses)} of {len(steps)} commands "
        f"(exit status {returncode}):\n{stdout}"
    )
    for n, (step, output, status) in enumerate(zip(steps, outputs, statuses, strict=True)):
        shown = "\n".join(step.expected)
        if not matches(step.expected, output):
            diff = "\n".join(
                difflib.unified_diff(
                    [_NOTE.sub("", line).rstrip() for line in step.expected],
                    _normal(output).splitlines(),
                    "shown",
                    "printed",
                    lineterm="",
                )
            )
            pytest.fail(f"{source}: $ {step.command}\nshows:\n{shown}\nprints:\n{output}\n{diff}")
        checked = n + 1 < len(steps) and steps[n + 1].command.strip() == "echo $?"
        assert status == "0" or checked, (
            f"{source}: $ {step.command}\nexited {status} (follow it with `$ echo $?` to "
            f"show a status other than 0); it printed:\n{output}"
        )
