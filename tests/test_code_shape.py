"""The code's shape, kept by a test (issue 40: a codebase a newcomer can take over).

Every module of ``store/``, ``sync/`` and ``daemon/`` stays under about 500 lines and
every function under 60 (tables, such as the OpenAPI document's schemas, aside); no
block is above radon's grade C (cyclomatic complexity 20); and no import sits inside a
function, except those named below that defer a heavy import for start-up speed. The
layers themselves are import-linter's contracts (``tests/test_lint.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import cc_rank, cc_visit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("store", "sync", "daemon")
MODULE_LINES = 525  # "about 500"
FUNCTION_LINES = 60

TABLES = {
    # Functions that are one literal table: the OpenAPI document and its schemas.
    "daemon/openapi.py",
}
LATE_IMPORTS = {
    # module: why its functions import late (start-up speed, never to dodge a cycle)
    "sync/url.py": "a folder store never loads boto3",
    "daemon/__init__.py": "__version__'s importlib.metadata, only when asked for",
    "daemon/cli_quick.py": "ledgerctl's quick path loads only what one request needs",
    "daemon/cli.py": "argcomplete, only when the shell asks for completions",
    "daemon/cli_progress.py": "tqdm, only on a terminal",
    "daemon/main.py": "`ledgerd key` and --check-config need none of the server",
    "daemon/keys.py": "only `ledgerd key rotate` needs the store and the sync engine",
}


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_modules_are_under_about_500_lines() -> None:
    long = {
        _name(p): n
        for p in _modules()
        if _name(p) not in TABLES and (n := len(p.read_text().splitlines())) > MODULE_LINES
    }
    assert not long, f"modules over {MODULE_LINES} lines: {long}"


def test_functions_are_under_60_lines() -> None:
    long = []
    for p in _modules():
        if _name(p) in TABLES:
            continue
        for f in _functions(ast.parse(p.read_text())):
            n = (f.end_lineno or f.lineno) - f.lineno + 1
            if n > FUNCTION_LINES:
                long.append(f"{_name(p)}:{f.lineno} {f.name} ({n} lines)")
    assert not long, f"functions over {FUNCTION_LINES} lines: {long}"


def test_no_block_is_above_grade_c() -> None:
    complex_ = [
        f"{_name(p)}:{b.lineno} {b.name} ({cc_rank(b.complexity)} {b.complexity})"
        for p in _modules()
        for b in cc_visit(p.read_text())
        if cc_rank(b.complexity) not in "ABC"
    ]
    assert not complex_, f"blocks above radon's grade C: {complex_}"


def test_no_import_inside_a_function_but_for_start_up() -> None:
    late = sorted(
        {
            f"{_name(p)}:{n.lineno}"
            for p in _modules()
            if _name(p) not in LATE_IMPORTS
            for f in _functions(ast.parse(p.read_text()))
            for n in ast.walk(f)
            if isinstance(n, ast.Import | ast.ImportFrom)
        }
    )
    assert not late, f"imports inside functions: {late}"
