"""The CLI's shape: one module of pagetier/cli/ per command, each with a click ``command``, and
the CLI the top layer (no library module imports it). The import-linter contract checks the
layers below it; this checks the ones this layout adds."""
import ast
import importlib
from pathlib import Path

import click

from pagetier import cli

REPO = Path(__file__).resolve().parent.parent
LIBRARY = [REPO / d for d in ("profiler", "daemon", "policies")] + [REPO / "pagetier"]


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_every_command_is_one_module_with_a_click_command():
    files = {p.stem for p in (REPO / "pagetier/cli").glob("*.py")} - {"__init__", "__main__"}
    assert {m.rsplit(".", 1)[1] for m in cli.COMMANDS.values()} == files
    for name, mod in cli.COMMANDS.items():
        command = importlib.import_module(mod).command
        assert isinstance(command, click.Command) and command.name == name, (name, mod)


def test_library_modules_do_not_import_the_cli_or_the_vm_harness():
    bad = []
    for top in LIBRARY:
        for path in top.rglob("*.py"):
            if (REPO / "pagetier/cli") in path.parents:
                continue
            for name in _imports(path):
                if name == "pagetier.cli" or name.startswith("pagetier.cli.") or name == "testvm":
                    bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert not bad, bad
