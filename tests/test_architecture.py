"""Architecture tests: the import contracts in .importlinter, and the purity of plexrl.core.

Two checkers, each with a test that it can fail:

- import-linter (run as ``lint-imports`` in a subprocess) keeps the package boundaries of
  ../shared/STYLE.md; a copy of the package with one injected bad import must break them.
- an AST scan of ``plexrl/core/`` finds what a pure core must not do: read a clock, draw
  unseeded randomness, touch files, threads or processes, print, or import anything but the
  standard library and the vocabulary (``plexrl.protocol``, ``plexrl.config``,
  ``plexrl.errors``). It reports ``file:line: offence``.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE_DIR = REPO / "plexrl" / "core"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

BANNED_IMPORTS = frozenset({
    "time", "datetime", "random", "secrets", "threading", "multiprocessing", "asyncio",
    "concurrent", "os", "io", "pathlib", "socket", "subprocess", "logging", "sys", "uuid",
    "importlib", "builtins", "tempfile", "shutil", "signal",
})
BANNED_CALLS = frozenset({"print", "open", "input", "exec", "eval", "id", "hash",
                          "__import__", "breakpoint"})
VOCABULARY = ("plexrl.protocol", "plexrl.config", "plexrl.errors")


# --- import-linter -----------------------------------------------------------------------

def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """Run lint-imports on the package under ``root`` with ``root/.importlinter``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(root / ".importlinter")],
        cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_import_contracts_are_kept():
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _copy_package(dest: Path) -> Path:
    shutil.copytree(REPO / "plexrl", dest / "plexrl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / ".importlinter", dest / ".importlinter")
    return dest


def _inject(path: Path, line: str) -> int:
    """Append ``line`` to the module at ``path``; returns its 1-based line number."""
    text = path.read_text() if path.exists() else ""
    text = text if text.endswith("\n") or not text else text + "\n"
    path.write_text(text + line + "\n")
    return text.count("\n") + 1


#: One failing example per rule: (module, a bad import appended to it, what it imports, the
#: contract's name). Each line alone breaks its contract; all go into one copy of the package,
#: so lint-imports runs once for them all.
INJECTED = [
    ("core/__init__.py", "import plexrl.sim", "plexrl.sim", "core and client import only"),
    ("core/__init__.py", "import numpy", "numpy", "core and client import only"),
    ("client/__init__.py", "from plexrl import timeline", "plexrl.timeline",
     "core and client import only"),
    ("rl/__init__.py", "import plexrl.runtime", "plexrl.runtime", "do not import each other"),
    ("timeline.py", "import torch", "torch", "only runtime and losses import torch"),
    ("losses/__init__.py", "import ray", "ray", "only runtime imports ray"),
    # the runtime's rooms: downward only, and submitted / observe independent of each other
    ("runtime/tiers/__init__.py", "import plexrl.runtime.workers", "plexrl.runtime.workers",
     "the runtime's rooms import only"),
    ("runtime/workers/__init__.py", "import plexrl.runtime.control", "plexrl.runtime.control",
     "the runtime's rooms import only"),
    ("runtime/observe/__init__.py", "import plexrl.runtime.submitted",
     "plexrl.runtime.submitted", "the runtime's rooms import only"),
    ("runtime/control/__init__.py", "import plexrl.runtime.transport",
     "plexrl.runtime.transport", "the runtime's rooms import only"),
    ("runtime/config.py", "import plexrl.runtime.tiers", "plexrl.runtime.tiers",
     "the runtime's rooms import only"),
    # the simulator's rooms
    ("sim/experiments/__init__.py", "import plexrl.sim.cluster", "plexrl.sim.cluster",
     "the simulator's rooms"),
    ("sim/scenario.py", "import plexrl.sim.experiments", "plexrl.sim.experiments",
     "the simulator's rooms"),
]


@pytest.fixture(scope="module")
def injected_report(tmp_path_factory):
    """lint-imports on a copy of the package with every line of INJECTED appended; returns
    the report and the line number each injection landed on."""
    root = _copy_package(tmp_path_factory.mktemp("injected"))
    lines = [_inject(root / "plexrl" / module, bad) for module, bad, _, _ in INJECTED]
    result = _lint_imports(root)
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stdout + result.stderr, lines


@pytest.mark.parametrize("case", range(len(INJECTED)),
                         ids=[f"{m}:{imp}" for m, _, imp, _ in INJECTED])
def test_import_contracts_catch_an_injected_import(injected_report, case):
    report, lines = injected_report
    module, _, imported, contract = INJECTED[case]
    importer = "plexrl." + module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    broken = report.split("Broken contracts", 1)[-1]
    assert contract in broken, report
    # the line number proves lint-imports read the copy, and this line broke a contract
    assert f"{importer} -> {imported} (l.{lines[case]})" in report, report


def test_import_circle_is_caught(tmp_path):
    """Two sibling modules that import each other break "no import circles", even when one
    import is for type checking only (as core/costs.py and core/snapshot.py once did)."""
    root = _copy_package(tmp_path)
    _inject(root / "plexrl" / "core" / "estimates.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from plexrl.core.snapshot import Snapshot")
    result = _lint_imports(root)
    report = result.stdout + result.stderr
    assert result.returncode == 1, report
    assert "no import circles among sibling modules BROKEN" in report, report
    assert "No cycles are allowed in plexrl.core" in report, report


# --- AST scan of the core ----------------------------------------------------------------

@dataclass(frozen=True)
class Offence:
    """One thing a pure core module must not do, and where."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: resolve against the module's package
        parents = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(parents + ([node.module] if node.module else []))
    # `from a import b`: b may be a submodule, so judge `a.b`
    return [base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names]


def _import_offence(name: str, package: str) -> str | None:
    root = name.split(".")[0]
    if root in BANNED_IMPORTS:
        return f"imports {name}"
    if root == "plexrl":
        own = package.split(".")[:2]
        allowed = (*VOCABULARY, ".".join(own))
        if not any(name == a or name.startswith(a + ".") for a in allowed):
            return f"imports {name} (outside the vocabulary)"
        return None
    if root not in sys.stdlib_module_names and root != "__future__":
        return f"imports third-party {name}"
    return None


def _call_offence(node: ast.Call) -> str | None:
    name = _dotted(node.func)
    if name is None:
        return None
    if name in BANNED_CALLS:
        return f"calls {name}()"
    if "." in name and name.split(".")[0] in BANNED_IMPORTS:
        return f"calls {name}()"
    return None


def scan_source(source: str, path: str = "<string>", package: str = "plexrl.core"
                ) -> list[Offence]:
    """Offences in one module of ``package``, in source order."""
    offences = []
    for node in ast.walk(ast.parse(source, filename=path)):
        whats: list[str | None] = []
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            whats = [_import_offence(n, package) for n in _imported_names(node, package)]
        elif isinstance(node, ast.Call):
            whats = [_call_offence(node)]
        offences += [Offence(path, node.lineno, w) for w in whats if w]
    return sorted(offences, key=lambda o: (o.line, o.what))


def scan_package(directory: Path) -> list[Offence]:
    """Offences in every module under ``directory`` (a package inside REPO)."""
    offences = []
    for file in sorted(directory.rglob("*.py")):
        package = ".".join(file.parent.relative_to(REPO).parts)
        offences += scan_source(file.read_text(), str(file.relative_to(REPO)), package)
    return offences


@pytest.mark.parametrize(("source", "what"), [
    *[(f"import {m}", f"imports {m}") for m in sorted(BANNED_IMPORTS)],
    ("from concurrent.futures import Future", "imports concurrent.futures.Future"),
    ("from time import monotonic", "imports time.monotonic"),
    ("import os.path as p", "imports os.path"),
    *[(f"{c}(x)", f"calls {c}()") for c in sorted(BANNED_CALLS)],
    ("now = time.monotonic()", "calls time.monotonic()"),
    ("stamp = datetime.datetime.now()", "calls datetime.datetime.now()"),
    ("x = random.random()", "calls random.random()"),
    ("import numpy as np", "imports third-party numpy"),
    ("from plexrl.sim.experiments import loop",
     "imports plexrl.sim.experiments.loop (outside the vocabulary)"),
    ("from .. import timeline", "imports plexrl.timeline (outside the vocabulary)"),
])
def test_scanner_catches_each_offence_kind(source, what):
    text = f'"""A module."""\n\n\ndef f(x):\n    {source}\n'
    offences = scan_source(text, "plexrl/core/bad.py")
    assert [str(o) for o in offences] == [f"plexrl/core/bad.py:5: {what}"]


def test_scanner_allows_pure_code():
    source = (
        "from __future__ import annotations\n"
        "import dataclasses, enum, heapq, math\n"
        "from typing import TYPE_CHECKING\n"
        "from plexrl.protocol import JobId\n"
        "from plexrl.errors import PlexError\n"
        "from plexrl.core.snapshot import Snapshot\n"
        "from . import events\n"
        "def f(rng, now_s, job):\n"
        "    return sorted([rng.random(), job.id, math.floor(now_s), hash_of(job)])\n"
    )
    assert scan_source(source) == []


def test_core_is_pure():
    offences = scan_package(CORE_DIR)
    assert not offences, "\n".join(map(str, offences))
