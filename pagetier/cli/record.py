"""``pagetier record``: record page-access counts into a trace, or import sampled addresses
(profiler/record.py and profiler/importer.py do the work)."""
from __future__ import annotations

import json
import signal
import subprocess

import click

from pagetier.cli import check_output, check_profiler_options, stop_child
from pagetier.errors import ConfigError, PagetierError
from pagetier.profiler.base import create
from pagetier.profiler.record import Progress, record_trace


def _options(pairs) -> dict:
    out = {}
    for kv in pairs:
        if "=" not in kv:
            raise ConfigError(f"--option {kv!r}: use KEY=VALUE")
        k, v = kv.split("=", 1)
        k = k.strip().replace("-", "_")
        out[k] = int(v) if v.strip().lstrip("-").isdigit() else v.strip()
    return out


def _pids(text: str) -> list[int]:
    try:
        pids = [int(p) for p in text.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"--pid {text!r}: give process ids, e.g. 1234 or 1234,1240") from None
    if not pids or any(p <= 0 for p in pids):
        raise ConfigError(f"--pid {text!r}: give positive process ids")
    return pids


@click.command("record", context_settings={"ignore_unknown_options": False})
@click.option("--backend", "-b", default="kmod", show_default=True,
              help="profiler backend: kmod, damon, bpf, replay, stub")
@click.option("--option", "-O", "options", multiple=True, metavar="KEY=VALUE",
              help="a backend option (repeatable), e.g. mode=abit for kmod, mark=kmod for bpf")
@click.option("--pid", "-p", "pid_text", metavar="PID[,PID...]", help="processes to record")
@click.option("--interval", "interval_ms", type=click.IntRange(1, None), default=1000,
              show_default=True, help="milliseconds between reads")
@click.option("--duration", type=click.FloatRange(0, None, min_open=True),
              help="seconds to record (default: until the processes exit or Ctrl-C)")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="trace file to write (Parquet)")
@click.option("--all-pages", is_flag=True, help="keep units with zero counts too")
@click.option("--no-nodes", is_flag=True, help="do not ask the kernel for each page's node")
@click.option("--import", "import_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="convert sampled addresses (CSV/Feather: timestamp,address[,pid,node]) "
                   "instead of recording")
@click.option("--columns", "columns", metavar="time=COL,addr=COL[,pid=COL,node=COL]",
              help="with --import: the columns to read (default: found by their usual names, "
                   "e.g. time_ns, data_addr)")
@click.option("--time-unit", default="auto", show_default=True,
              type=click.Choice(["auto", "s", "ms", "us", "ns"]), help="with --import")
@click.option("--quiet", "-q", is_flag=True, help="no progress line")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(backend, options, pid_text, interval_ms, duration, output, all_pages, no_nodes,
            import_path, columns, time_unit, quiet, as_json, cmd):
    """Record page-access counts of processes into a trace file.

    \b
    Examples:
      pagetier record --pid 1234 --duration 30 -o run.parquet
      pagetier record -b damon -o run.parquet -- ./myjob --its-args
      pagetier record -b kmod -O mode=abit --interval 500 -p 1234 -o run.parquet
      pagetier record -b bpf -O mark=kmod -p 1234 --duration 10 -o faults.parquet
      pagetier record --import perf-mem.csv --interval 100 -o sampled.parquet
      pagetier record --import pebs.csv --columns time=tsc_ns,addr=vaddr -o sampled.parquet
    """
    check_output(output, "-o")
    if import_path:
        if pid_text or cmd:
            raise ConfigError("--import converts a file: give no --pid and no command")
        from pagetier.profiler.importer import import_samples

        summary = import_samples(import_path, output, interval_s=interval_ms / 1000,
                                 time_unit=time_unit, columns=columns)
        _print_summary(summary, as_json)
        return
    if columns:
        raise ConfigError("--columns goes with --import")
    if bool(pid_text) == bool(cmd):
        raise ConfigError("record: give either --pid PID or -- CMD ...")
    opts = _options(options)
    check_profiler_options(backend, opts, "-O")
    pids = _pids(pid_text) if pid_text else None
    profiler = create(backend, **opts)
    child = None
    stopping = {"flag": False}

    def on_signal(signum, frame):
        stopping["flag"] = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if cmd:
            try:
                child = subprocess.Popen(list(cmd))
            except OSError as e:
                raise PagetierError(f"record: cannot start {cmd[0]}: {e.strerror}") from None
            pids = [child.pid]
        summary = record_trace(profiler, pids, output, interval_s=interval_ms / 1000,
                               duration=duration, all_pages=all_pages, nodes=not no_nodes,
                               meta={"command": " ".join(cmd)} if cmd else None, child=child,
                               progress=Progress(not quiet), stop=lambda: stopping["flag"],
                               follow=None if child is None else _descendants(child))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        profiler.close()
        stop_child(child)
    if child is not None:
        summary["exit_status"] = child.returncode
    _print_summary(summary, as_json)


def _descendants(child: subprocess.Popen):
    """The started command's descendants (children, grandchildren, later forks), asked before
    each read while it runs: the trace records its whole process tree."""
    import psutil

    def follow() -> list[int]:
        if child.poll() is not None:
            return []
        try:
            return [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
        except psutil.Error:
            return []
    return follow


def _print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
        return
    parts = [f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
             for k, v in summary.items() if k not in ("output", "stats")]
    click.echo(f"wrote {summary['output']}: " + ", ".join(parts))
