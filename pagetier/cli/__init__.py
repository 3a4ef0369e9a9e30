"""The pagetier command: one click group, one module of pagetier/cli/ per command.

The CLI is the top layer: it parses options and prints; what a command does lives in profiler/,
daemon/, policies/ and pagetier/bench/, which never import from here. Each command module is
loaded only when its command runs (``pagetier --help`` imports none of them).
"""
from __future__ import annotations

import importlib
import sys

import click

from pagetier.errors import ConfigError, PagetierError

# subcommand name -> module of pagetier/cli/ holding a click command named `command`
COMMANDS = {
    "attach": "pagetier.cli.attach",
    "bench": "pagetier.cli.bench",
    "demo": "pagetier.cli.demo",
    "heatmap": "pagetier.cli.heatmap",
    "kmod": "pagetier.cli.kmod",
    "kube-sync": "pagetier.cli.kube_sync",
    "record": "pagetier.cli.record",
    "report": "pagetier.cli.report",
    "run": "pagetier.cli.run",
    "status": "pagetier.cli.status",
    "train-rl": "pagetier.cli.train_rl",
    "workload": "pagetier.cli.workload",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        mod = COMMANDS.get(name)
        if mod is None:
            return None
        return importlib.import_module(mod).command


def _version(ctx, param, value):
    """--version: the version is read only then (pagetier.__version__ imports numpy)."""
    if not value or ctx.resilient_parsing:
        return
    from pagetier import __version__

    click.echo(f"pagetier, version {__version__}")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and exit.")
def cli():
    """pagetier: profile page accesses and move hot pages to the fast memory tier."""


def main(argv=None):
    """The console script. Every user error ends as one line on stderr, "pagetier: ...", and
    exit status 1: pagetier's own errors, click's usage errors (a bad option value, an unknown
    command) and a file the command could not open or write."""
    try:
        rv = cli.main(args=argv, prog_name="pagetier", standalone_mode=False)
    except PagetierError as e:
        _fail(str(e))
    except click.exceptions.Abort:  # Ctrl-C where click reads input
        _fail("aborted")
    except click.exceptions.NoArgsIsHelpError as e:  # `pagetier bench`: its help, not an error
        click.echo(e.ctx.get_help())
        sys.exit(0)
    except click.ClickException as e:
        ctx = getattr(e, "ctx", None)
        _fail(e.format_message(), ctx.command_path if ctx is not None else "pagetier")
    except OSError as e:
        if e.filename is None:
            raise
        _fail(f"{e.filename}: {e.strerror or e}")
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, where: str = "pagetier"):
    click.echo(f"{where}: {' '.join(message.split())}", err=True)
    sys.exit(1)


# ----------------------------------------------------------------- helpers the commands share
def resolve_trace(spec: str) -> str:
    """The trace file of a TRACE argument: ``builtin:NAME`` (``pagetier bench traces`` lists
    them) or a file written by ``pagetier record``; ConfigError saying which when neither."""
    import os

    if spec.startswith("builtin:"):
        from pagetier.policies import builtin_traces

        return str(builtin_traces.path(spec[len("builtin:"):]))
    if spec.startswith("synth:"):
        raise ConfigError(f"{spec}: synthetic traces are for `pagetier bench sim` and "
                          "`pagetier train-rl`; give a trace file or builtin:NAME")
    if not os.path.exists(spec):
        raise ConfigError(f"{spec}: no such trace file (give a file from `pagetier record`, or "
                          "builtin:NAME from `pagetier bench traces`)")
    return spec


def check_output(path: str, option: str = "-o", suffixes: tuple[str, ...] = ()) -> None:
    """Before any work: ``path`` has one of ``suffixes`` (when given) and a directory that
    exists and can be written, or a ConfigError saying what would be right."""
    import os
    from pathlib import Path

    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        names = " or ".join([", ".join(suffixes[:-1]), suffixes[-1]] if suffixes[:-1] else suffixes)
        raise ConfigError(f"{option} {path}: format {p.suffix.lstrip('.') or '(none)'!r} is not "
                          f"supported; name a {names} file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{option} {path}: directory {parent} does not exist (create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: directory {parent} is not writable")


def check_profiler_options(backend: str, options: dict, where: str = "") -> None:
    """Before the backend is probed or started: ``options`` are among the options its class
    takes, or a ConfigError listing those by name. (Backends live in modules named after them,
    pagetier/profiler/<name>.py; an unknown name is left to profiler.base.create to report.)"""
    import importlib
    import inspect

    from pagetier.profiler import base

    if backend not in base.PROFILERS:
        try:
            importlib.import_module(f"pagetier.profiler.{backend}")
        except ImportError:
            return
    cls = base.PROFILERS.get(backend)
    if cls is None:
        return
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n, p in params.items()
             if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    bad = sorted(set(options) - set(known))
    if bad:
        pre = f"{where}: " if where else ""
        raise ConfigError(f"{pre}profiler {backend!r} has no option {bad[0]!r} "
                          f"(its options: {', '.join(known)})")


def stop_child(child, timeout: float = 10.0) -> None:
    """End a command pagetier started (``subprocess.Popen`` or None) if it still runs: SIGTERM,
    then SIGKILL after ``timeout`` seconds; either way it is reaped."""
    import subprocess

    if child is None or child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
