"""The pagetier command: one click group, one module of pagetier/cli/ per command.

The CLI is the top layer: it parses options and prints; what a command does lives in profiler/,
daemon/, policies/ and pagetier/bench/, which never import from here. Each command module is
loaded only when its command runs (``pagetier --help`` imports none of them).
"""
from __future__ import annotations

import importlib
import sys

import click

from pagetier import __version__
from pagetier.errors import PagetierError

# subcommand name -> module of pagetier/cli/ holding a click command named `command`
COMMANDS = {
    "attach": "pagetier.cli.attach",
    "bench": "pagetier.cli.bench",
    "demo": "pagetier.cli.demo",
    "heatmap": "pagetier.cli.heatmap",
    "kmod": "pagetier.cli.kmod",
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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pagetier")
def cli():
    """pagetier: profile page accesses and move hot pages to the fast memory tier."""


def main(argv=None):
    try:
        return cli.main(args=argv, prog_name="pagetier", standalone_mode=True)
    except PagetierError as e:
        click.echo(f"pagetier: {e}", err=True)
        sys.exit(1)
