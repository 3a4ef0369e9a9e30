"""pagetier record: read a profiler backend every interval and write the counts to a trace.

Each row keeps the unit's count and, in the ``freq`` column, the backend's estimate of its
accesses per second (NaN when the backend gave none: readers then derive it from the count).

``record_trace()`` does the work (tests and benchmarks call it); ``command`` is the CLI. The
trace's metadata keeps, per pid, the /proc/PID/maps lines and the data/bss objects of the
program's ELF file, so that ``pagetier report`` can name what is hot on another machine.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import numpy as np

from pagetier.errors import ConfigError, PagetierError
from pagetier.profiler.base import Profiler, Sample

MAX_SYMBOLS = 20000
DESCRIBE_AGAIN = 3  # reads in which a process whose command line was empty is described again


def read_maps(pid: int) -> list[list]:
    """[[start, end, perms, name], ...] of /proc/PID/maps ([] when unreadable)."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) < 5:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append([lo, hi, parts[1], parts[5].strip() if len(parts) > 5 else ""])
    except OSError:
        pass
    return out


def elf_objects(path: str, maps: list[list]) -> list[list]:
    """[[start, size, name, section], ...]: data and bss objects of the ELF file at ``path``, at
    their run-time addresses (the load bias found from ``maps``)."""
    try:
        from elftools.elf.elffile import ELFFile
        from elftools.common.exceptions import ELFError
    except ImportError:
        return []
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            bias = 0
            if elf["e_type"] == "ET_DYN":
                starts = [m[0] for m in maps if m[3] == path]
                if not starts or not loads:
                    return []
                first = min(loads, key=lambda s: s["p_vaddr"])
                bias = min(starts) - (first["p_vaddr"] & ~0xFFF)
            secs = {i: s.name for i, s in enumerate(elf.iter_sections())}
            wanted = {i for i, n in secs.items() if n.startswith((".data", ".bss", ".rodata", ".tbss"))
                      and not n.startswith(".tbss")}
            out = []
            for symtab in (elf.get_section_by_name(".symtab"), elf.get_section_by_name(".dynsym")):
                if symtab is None:
                    continue
                for sym in symtab.iter_symbols():
                    shndx = sym["st_shndx"]
                    if (sym["st_info"]["type"] != "STT_OBJECT" or not isinstance(shndx, int)
                            or shndx not in wanted or sym["st_size"] == 0 or not sym.name):
                        continue
                    out.append([int(sym["st_value"]) + bias, int(sym["st_size"]), sym.name,
                                secs[shndx]])
                if out:
                    break  # .symtab has everything .dynsym has
    except (OSError, ELFError, ValueError, KeyError):
        return []
    out.sort(key=lambda r: -r[1])
    return sorted(out[:MAX_SYMBOLS])


def describe_process(pid: int) -> dict:
    """What the trace keeps about ``pid``: command line, maps, ELF objects of its executable."""
    info: dict = {"maps": read_maps(pid), "symbols": [], "exe": ""}
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            info["cmdline"] = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        info["cmdline"] = []
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        info["exe"] = exe
        info["symbols"] = elf_objects(exe, info["maps"])
    except OSError:
        pass
    return info


def _command(info: dict) -> str:
    """A process's command line (from :func:`describe_process`) as one shell-quoted string."""
    return " ".join(shlex.quote(a) for a in info["cmdline"])


def fill_nodes(sample) -> None:
    """Ask the kernel (move_pages) for the node of units the backend left at -1."""
    unknown = sample.node < 0
    if not unknown.any():
        return
    try:
        from pagetier.core import mover

        nodes = mover.query_nodes(sample.pid, sample.addr[unknown])
    except Exception:  # no libnuma, no permission, process gone: nodes stay unknown
        return
    sample.node[unknown] = np.where(nodes >= 0, nodes, -1).astype(np.int16)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Progress:
    def __init__(self, enabled: bool, stream=sys.stderr):
        self.enabled, self.stream = enabled, stream
        self.tty = enabled and stream.isatty()
        self.last = 0.0

    def show(self, t: float, interval: int, pages: int, rows: int, path: str) -> None:
        if not self.enabled:
            return
        try:
            size = os.path.getsize(path) / 1e6
        except OSError:
            size = 0.0
        line = (f"recording {t:7.1f} s  interval {interval:5d}  {pages:8d} pages accessed  "
                f"{rows:9d} rows  {size:7.1f} MB")
        if self.tty:
            self.stream.write("\r" + line[:79])
            self.stream.flush()
        elif t - self.last >= 5 or interval == 0:
            self.stream.write(line + "\n")
            self.last = t

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _accessed(s: Sample) -> Sample:
    """``s`` with only the units accessed in the interval (a count or a frequency above 0);
    every per-unit column comes along."""
    keep = s.count > 0
    if len(s.freq) == len(s):
        keep |= s.freq > 0
    per_unit = {f.name: getattr(s, f.name)[keep] for f in dataclasses.fields(s)
                if isinstance(getattr(s, f.name), np.ndarray) and len(getattr(s, f.name)) == len(s)}
    return dataclasses.replace(s, **per_unit, complete=False, span=None)


def _attach(profiler: Profiler, pids: list[int]) -> dict:
    """Attach ``profiler`` to every pid (all of them alive first); their descriptions."""
    for pid in pids:
        if not _alive(pid):
            raise PagetierError(f"record: no such process {pid}")
    procs = {}
    for pid in pids:
        try:
            profiler.attach(pid)
        except ProcessLookupError as e:
            raise PagetierError(f"record: {e}") from None
        procs[pid] = describe_process(pid)
    return procs


def _follow(profiler: Profiler, new, pids: list[int], live: list[int], procs: dict) -> None:
    """Attach to and describe the processes of ``new`` not recorded yet (one that exits or
    cannot be attached meanwhile is skipped)."""
    for pid in new:
        if pid in procs or not _alive(pid):
            continue
        try:
            profiler.attach(pid)
        except (PagetierError, OSError):
            continue
        procs[pid] = describe_process(pid)
        pids.append(pid)
        live.append(pid)


def _trace_meta(profiler: Profiler, pids: list[int], interval_s: float, all_pages: bool,
                meta: dict | None, procs: dict) -> dict:
    """The trace's metadata at the start (the process details are added by :func:`_finish`)."""
    m = {"backend": profiler.name, "interval_s": float(interval_s), "pids": list(pids),
         "kernel": platform.release(), "complete": bool(all_pages)}
    m.update(meta or {})
    m.setdefault("mode", getattr(profiler, "mode", ""))
    m.setdefault("command", _command(procs[pids[0]]))
    return m


def _read(profiler: Profiler, pid: int, all_pages: bool) -> Sample | None:
    """One read of ``pid`` (None when it has gone); without ``all_pages``, the accessed units
    only. pagetier.ko is read in full and filtered here (the read path checked in the VM for
    both modes); other backends filter themselves."""
    native = profiler.name != "kmod"
    try:
        s = profiler.read(pid, reset=True, accessed_only=not all_pages and native)
    except (ProcessLookupError, PagetierError) as e:
        if not _alive(pid):
            return None
        raise PagetierError(f"record: reading pid {pid}: {e}") from None
    return s if all_pages or native else _accessed(s)


def _describe_again(procs: dict, pid: int, interval: int) -> None:
    """A program maps more as it runs: its maps are read again each interval (up to a size),
    or its whole description while its command line reads empty (read during execve: the
    new memory has no argument area yet)."""
    if not procs[pid]["cmdline"] and interval < DESCRIBE_AGAIN:
        procs[pid] = describe_process(pid)
    elif len(procs[pid]["maps"]) < 400000:
        newer = read_maps(pid)
        if newer:
            procs[pid]["maps"] = newer


def _wait(next_t: float, t0: float, duration: float | None, stop) -> bool:
    """Sleep until the next read (or the end of ``duration``); whether ``stop()`` asked to
    stop (Ctrl-C or SIGTERM: there is one last read, so the counts since the last are kept)."""
    if stop is not None and stop():
        return True
    wake = next_t if duration is None else min(next_t, t0 + duration)
    time.sleep(max(0.0, wake - time.monotonic()))
    return stop is not None and stop()


def _read_all(profiler: Profiler, w, live: list[int], procs: dict, interval: int, t: float,
              all_pages: bool, nodes: bool, child) -> int:
    """Read every live pid into the trace writer ``w`` (dropping the ones that have exited);
    the pages accessed in the interval."""
    pages = 0
    for pid in list(live):
        if not _alive(pid) or (child is not None and child.pid == pid and child.poll() is not None):
            live.remove(pid)
            continue
        s = _read(profiler, pid, all_pages)
        if s is None:
            live.remove(pid)
            continue
        if nodes and len(s):
            fill_nodes(s)
        w.add(interval, t, s)
        pages += int((s.count > 0).sum())
        _describe_again(procs, pid, interval)
    return pages


def _detach(profiler: Profiler, pids: list[int]) -> dict:
    """The backend's stats per pid, then detach from each (a pid gone meanwhile is skipped)."""
    stats = {}
    for pid in pids:
        try:
            stats[str(pid)] = profiler.stats(pid)
        except (PagetierError, ProcessLookupError, OSError):
            pass
        try:
            profiler.detach(pid)
        except (PagetierError, ProcessLookupError, OSError):
            pass
    return stats


def record_trace(profiler: Profiler, pids: list[int], out: str, interval_s: float = 1.0,
                 duration: float | None = None, all_pages: bool = False, nodes: bool = True,
                 meta: dict | None = None, child: subprocess.Popen | None = None,
                 progress: Progress | None = None, stop=None, follow=None) -> dict:
    """Attach ``profiler`` to ``pids``, read every ``interval_s`` into a trace at ``out``.

    ``follow()`` (optional) gives, before each read, the pids to record from then on too (the
    started command's descendants): each is attached and described, and its rows carry its
    own pid like every process's. Stops after ``duration`` seconds, when every pid has exited,
    or when ``stop()`` returns True. Returns a summary dict.
    """
    from pagetier.profiler.trace import TraceWriter

    if interval_s <= 0:
        raise ConfigError("record: the interval must be positive")
    progress = progress or Progress(False)
    procs = _attach(profiler, pids)
    m = _trace_meta(profiler, pids, interval_s, all_pages, meta, procs)
    pids = list(pids)  # grows with the followed processes
    live = list(pids)
    pages_total, t0 = 0, time.monotonic()
    tmp = out + ".partial"
    interval = 0
    with TraceWriter(tmp, {**m, "processes": {}}) as w:
        next_t = t0 + interval_s
        # The duration is checked after each read, so a recorder starved of CPU (seen in the
        # test VM while pagetier.ko's fault mode scans) still reads at least once.
        while live:
            stopping = _wait(next_t, t0, duration, stop)
            t = time.monotonic() - t0
            next_t = max(next_t + interval_s, time.monotonic())  # late: no burst of reads
            if follow is not None:
                _follow(profiler, follow(), pids, live, procs)
            pages = _read_all(profiler, w, live, procs, interval, t, all_pages, nodes, child)
            pages_total += pages
            progress.show(t, interval, pages, w.rows + w._buffered, tmp)
            interval += 1
            if stopping or (duration is not None and time.monotonic() - t0 >= duration):
                break
        rows = w.rows + w._buffered
    progress.done()
    stats = _detach(profiler, pids)
    # The final file has the process details (maps, symbols) in its metadata.
    _finish(tmp, out, {str(p): v for p, v in procs.items()}, _command(procs[pids[0]]))
    return {"output": out, "intervals": interval, "rows": rows, "seconds": time.monotonic() - t0,
            "backend": profiler.name, "pids": list(pids), "pages_accessed": pages_total,
            "stats": stats}


def _finish(tmp: str, out: str, processes: dict, command: str = "") -> None:
    """Copy ``tmp`` to ``out`` with the process details added to the metadata (and the first
    process's ``command`` where the start left it empty)."""
    import pyarrow.parquet as pq

    from pagetier.profiler.trace import META_KEY

    pf = pq.ParquetFile(tmp)
    meta = json.loads(pf.schema_arrow.metadata[META_KEY])
    meta["processes"] = processes
    if not meta.get("command"):
        meta["command"] = command
    sch = pf.schema_arrow.with_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})
    with pq.ParquetWriter(out, sch, compression="zstd") as w:
        for i in range(pf.num_row_groups):
            w.write_table(pf.read_row_group(i).cast(sch))
    os.unlink(tmp)
