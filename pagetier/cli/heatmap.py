"""``pagetier heatmap``: draw a trace as time x address (profiler/heatmap.py draws it)."""
from __future__ import annotations

import json

import click

from pagetier.cli import check_output, resolve_trace
from pagetier.errors import ConfigError
from pagetier.profiler.heatmap import (ASCII_WIDTH, METRICS, ascii_heatmap, heat, png_heatmap,
                                       title_of)


@click.command("heatmap")
@click.argument("trace_file", metavar="TRACE")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="image to write: .png, .svg or .pdf")
@click.option("--ascii", "as_ascii", is_flag=True, help="print the heatmap in the terminal")
@click.option("--pid", type=int, help="which process of the trace (default: the first)")
@click.option("--rows", type=click.IntRange(2, 4096), help="address rows (PNG 256, ASCII 20)")
@click.option("--cols", type=click.IntRange(1, 4096), help="time columns (ASCII at most 64)")
@click.option("--gap", default="1M", show_default=True,
              help="collapse unmapped address ranges larger than this (K, M, G suffixes)")
@click.option("--only-accessed", is_flag=True,
              help="draw only the pages that were accessed (leave the idle mapped memory out)")
@click.option("--metric", type=click.Choice(METRICS),
              help="freq: estimated accesses/s (default when the trace has estimates); count")
@click.option("--json", "as_json", is_flag=True, help="print the heat matrix as JSON")
def command(trace_file, output, as_ascii, pid, rows, cols, gap, only_accessed, metric, as_json):
    """Draw TRACE (a file from `pagetier record`, or builtin:NAME) as time x address: the
    memory the process had mapped, idle parts dark, with unmapped address gaps collapsed.

    \b
    Examples:
      pagetier heatmap run.parquet -o heat.png
      pagetier heatmap run.parquet --ascii
      pagetier heatmap builtin:redis --ascii --only-accessed
      pagetier heatmap run.parquet --json --rows 32 > heat.json
      pagetier heatmap run.parquet --ascii --metric count
    """
    from pagetier.profiler.trace import read_trace

    if not (output or as_ascii or as_json):
        raise ConfigError("heatmap: give -o FILE.png, --ascii or --json")
    if output:
        check_output(output, "-o", IMAGE_SUFFIXES)
    gap_b = _size(gap)
    trace = read_trace(resolve_trace(trace_file))
    if as_ascii or as_json:
        width_cols = ASCII_WIDTH - 16
        h = heat(trace, pid, rows=rows or 20, cols=min(cols or width_cols, width_cols), gap=gap_b,
                 metric=metric, only_accessed=only_accessed)
        if as_json:
            click.echo(json.dumps(h.to_json()))
        else:
            click.echo(ascii_heatmap(h, title_of(trace, h.pid)))
    if output:
        h = heat(trace, pid, rows=rows or 256, cols=cols, gap=gap_b, metric=metric,
                 only_accessed=only_accessed)
        png_heatmap(h, output, title_of(trace, h.pid))
        if not as_json:
            click.echo(f"wrote {output}: {h.matrix.shape[1]} time columns x "
                       f"{h.matrix.shape[0]} address rows, {len(h.segments)} segment(s)")


IMAGE_SUFFIXES = (".png", ".svg", ".pdf")  # what matplotlib writes from the name alone


def _size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t.rstrip("KMG")) * mult)
    except ValueError:
        raise ConfigError(f"bad size {text!r}: use e.g. 512K, 1M or 1G") from None
