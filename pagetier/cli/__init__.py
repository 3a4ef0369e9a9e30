"""The pagetier command: one click group; each subcommand lives in the module that owns it."""
from __future__ import annotations

import importlib
import sys

import click

from pagetier import __version__
from pagetier.errors import PagetierError

# subcommand name -> module holding a click command named `command`
COMMANDS = {
    "vm": "pagetier.vm",
    "demo": "pagetier.demo",
    "kmod": "pagetier.profiler.kmod_cli",
    "run": "pagetier.daemon.cli",
    "attach": "pagetier.daemon.cli",
    "status": "pagetier.daemon.cli",
    "workload": "pagetier.workload",
    "train-rl": "pagetier.policies.sim_cli",
    "bench": "pagetier.policies.sim_cli",
    "record": "pagetier.profiler.record",
    "heatmap": "pagetier.profiler.heatmap",
    "report": "pagetier.profiler.report",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        mod = COMMANDS.get(name)
        if mod is None:
            return None
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:  # not built yet
                return None
            raise
        return getattr(module, "commands", {}).get(name) or getattr(module, "command", None)


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


if __name__ == "__main__":
    main()
