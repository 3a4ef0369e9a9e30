"""The layers of the code hold: no module imports from a layer above its own, and no package's
modules import each other in a cycle (import-linter, with the contracts in pyproject.toml).

The install maps the top-level folders daemon/, policies/ and profiler/ into the package
(pagetier.daemon, ...), and import-linter reads a package from one directory: the test copies
the sources into a temporary tree laid out as the import names, and lints that.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def import_tree(dest: Path) -> Path:
    """A copy of pagetier's sources under ``dest``, one folder per package as imported."""
    root = dest / "pagetier"
    spec = importlib.util.find_spec("pagetier")
    dirs = {root: Path(spec.submodule_search_locations[0])}
    for d in sorted(REPO.iterdir()):
        if d.name == "pagetier" or not (d / "__init__.py").is_file():
            continue
        sub = importlib.util.find_spec(f"pagetier.{d.name}")
        if sub is not None and Path(sub.submodule_search_locations[0]).resolve() == d.resolve():
            dirs[root / d.name] = d
    for to, src in dirs.items():
        shutil.copytree(src, to, dirs_exist_ok=True,
                        ignore=lambda _, names: [n for n in names
                                                 if not (n.endswith(".py") or "." not in n)
                                                 or n == "__pycache__"])
    return root


def lint(tmp_path: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(config), "--no-cache"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})


def test_the_layers_hold(tmp_path):
    if not LINT.exists():
        pytest.fail(f"{LINT} is missing: install the test dependencies (scripts/setup.sh)")
    import_tree(tmp_path)
    r = lint(tmp_path, REPO / "pyproject.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BROKEN" not in r.stdout and ", 0 broken" in r.stdout, r.stdout


@pytest.mark.parametrize("module,line,report", [
    # the core importing the daemon: an import from a layer above
    ("core/units.py", "from pagetier.daemon import config", "pagetier.core.units -> pagetier.daemon.config"),
    # two daemon modules importing each other: a cycle
    ("daemon/clock.py", "from pagetier.daemon import loop", "No cycles are allowed in pagetier.daemon"),
])
def test_a_broken_contract_is_reported(tmp_path, module, line, report):
    """The contracts can fail: an import that breaks one is reported."""
    import_tree(tmp_path)
    bad = tmp_path / "pagetier" / module
    bad.write_text(bad.read_text() + f"\n{line}  # noqa\n")
    r = lint(tmp_path, REPO / "pyproject.toml")
    assert r.returncode != 0 and report in r.stdout, r.stdout


def test_test_modules_have_unique_names():
    """pytest imports test files by basename (no packages under tests/): a host test and a
    guest test of the same name stop the whole run at collection."""
    tests = Path(__file__).resolve().parent
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
