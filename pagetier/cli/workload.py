"""``pagetier workload``: run the built-in hot/cold workload (pagetier/workloads/hotcold.c)."""
from __future__ import annotations

import os
import sys

import click

from pagetier.workload import binary


@click.command("workload", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args):
    """Run the built-in hot/cold workload (hotcold --help lists its options).

    \b
    Example: pagetier workload --size 256 --hot 64 --start-node 1 --duration 20
    """
    exe = str(binary())
    sys.stdout.flush()
    os.execv(exe, [exe, *args])
