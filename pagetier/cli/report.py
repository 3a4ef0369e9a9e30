"""``pagetier report``: the working set, hot set, residency and hottest regions of a trace
(profiler/report.py computes them)."""
from __future__ import annotations

import json

import click

from pagetier.cli import resolve_trace
from pagetier.profiler.report import METRICS, render, summarize


@click.command("report")
@click.argument("trace_file", metavar="TRACE")
@click.option("--window", type=click.IntRange(1, None), default=5, show_default=True,
              help="intervals the hot-set rule looks back")
@click.option("--hot-fraction", type=click.FloatRange(0, 1, min_open=True), default=0.5,
              show_default=True, help="share of the window a unit must be counted in to be hot")
@click.option("--top", type=click.IntRange(1, None), default=10, show_default=True,
              help="hottest regions listed")
@click.option("--metric", type=click.Choice(METRICS),
              help="rank regions by freq (estimated accesses/s; default when the trace has "
                   "estimates) or count")
@click.option("--json", "as_json", is_flag=True, help="everything as JSON")
def command(trace_file, window, hot_fraction, top, metric, as_json):
    """Working set, hot set, per-node residency and the hottest regions of a trace.

    \b
    Examples:
      pagetier report run.parquet
      pagetier report run.parquet --window 10 --hot-fraction 0.8 --json
      pagetier report run.parquet --metric count
      pagetier report builtin:redis
    """
    from pagetier.profiler.trace import read_trace

    rep = summarize(read_trace(resolve_trace(trace_file)), window, hot_fraction, top, metric)
    click.echo(json.dumps(rep, sort_keys=True) if as_json else render(rep))
