"""``pagetier status``: the running daemons, from their status files (daemon/status.py)."""
from __future__ import annotations

import json

import click

from pagetier.protocol import run_dir
from pagetier.daemon.status import format_status, read_status
from pagetier.errors import PagetierError


@click.command("status")
@click.option("--json", "-j", "json_", is_flag=True, help="the status files as JSON")
def command(json_):
    """Show the running daemons: targets, counters, the last interval.

    \b
    Example: pagetier status --json
    """
    docs = read_status()
    if json_:
        click.echo(json.dumps(docs))
        return
    if not docs:
        raise PagetierError(f"no pagetier daemon is running (no status files in {run_dir()})")
    click.echo("\n".join(format_status(d) for d in docs))
