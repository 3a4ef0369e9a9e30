"""pagetier heatmap: a trace's accesses over time (x) and address (y), as a PNG or in the terminal.

The address axis holds the process's memory: the ranges mapped at record time (the trace's
metadata keeps /proc/PID/maps) and every page that was accessed. Ranges closer than ``gap``
bytes form one segment; the unmapped space between segments is left out (segment boundaries
are marked). So the cold part of a program is drawn beside its hot part, and the picture shows
where the hot part sits. Each cell is the mean, over the 4 KiB pages of its address rows and
the intervals of its time columns, of one metric of the unit holding the page, on a log colour
scale; mapped memory nobody accessed is drawn dark, and rows with nothing mapped (small holes
inside a segment) stay blank. Traces without maps (imported samples) draw the accessed pages
only, as does ``only_accessed``. Metrics (``--metric``):

- ``freq``: the unit's estimated accesses per second (the trace's ``freq`` column), the default
  when the trace carries a backend's estimate;
- ``count``: the unit's count in the interval, the default for traces without estimates (there
  ``freq`` is only the count over the interval).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pagetier.core.arrays import unique
from pagetier.errors import ConfigError
from pagetier.profiler.base import PAGE_SIZE

ASCII_RAMP = ":-=+*#%@"  # 8 levels of log(value), coolest first
ASCII_IDLE = "."  # mapped, not accessed in the cell ("dark")
ASCII_UNMAPPED = " "
IDLE_COLOUR = "#0b1026"  # the PNG's mapped-but-idle cells: darker than the coldest heat
ASCII_WIDTH = 80
DEFAULT_GAP = 1 << 20


@dataclass
class Heat:
    matrix: np.ndarray  # (rows, cols) float64: mean count per page, row 0 = lowest address
    t_edges: np.ndarray  # (cols + 1,) seconds
    row_addr: np.ndarray  # (rows,) uint64: address at the start of each row
    segments: list[tuple[int, int]] = field(default_factory=list)  # (lo, hi) address ranges
    seg_rows: list[int] = field(default_factory=list)  # first row of each segment
    pid: int = 0
    pages: int = 0  # pages on the collapsed axis
    metric: str = "count"
    mapped: np.ndarray | None = None  # (rows,) bool: the row holds mapped or accessed memory

    def __post_init__(self):
        if self.mapped is None:
            self.mapped = np.ones(self.matrix.shape[0], bool)

    def to_json(self) -> dict:
        return {"pid": self.pid, "pages": self.pages, "metric": self.metric,
                "t_edges": [round(float(x), 6) for x in self.t_edges],
                "row_addr": [hex(int(a)) for a in self.row_addr],
                "segments": [[hex(lo), hex(hi)] for lo, hi in self.segments],
                "seg_rows": list(map(int, self.seg_rows)),
                "mapped": [bool(x) for x in self.mapped],
                "matrix": [[round(float(v), 4) for v in row] for row in self.matrix]}


def _pages_of(addr: np.ndarray, npages: np.ndarray, count: np.ndarray):
    """Expand units to 4 KiB pages: (page addresses, count per page, unit index)."""
    npages = npages.astype(np.int64)
    if len(npages) == 0 or npages.max(initial=1) <= 1:
        return addr.astype(np.uint64), count, np.arange(len(addr))
    idx = np.repeat(np.arange(len(addr)), npages)
    first = np.repeat(np.cumsum(npages) - npages, npages)
    k = np.arange(len(idx)) - first
    return addr[idx] + (k * PAGE_SIZE).astype(np.uint64), count[idx], idx


METRICS = ("freq", "count")
UNIT_LABEL = {"count": "count/page", "freq": "acc/s/unit"}


def default_metric(trace) -> str:
    """``freq`` when the trace carries a backend's estimate, else ``count``."""
    return "freq" if trace.has_freq else "count"


def mapped_ranges(trace, pid: int) -> np.ndarray:
    """(n, 2) uint64 [start, end) of ``pid``'s readable or writable mappings in the trace's
    metadata (PROT_NONE reservations and execute-only ranges are not memory a program uses)."""
    info = (trace.meta.get("processes") or {}).get(str(pid)) or {}
    out = [(int(m[0]), int(m[1])) for m in info.get("maps") or []
           if len(m) >= 3 and ("r" in str(m[2])[:2] or "w" in str(m[2])[:2]) and m[1] > m[0]]
    return np.array(out, np.uint64).reshape(-1, 2)


def _merge(lo: np.ndarray, hi: np.ndarray, slack: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted [lo, hi) ranges joined where the hole between them is at most ``slack`` bytes."""
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)  # the furthest end so far (ranges may nest)
    new = np.ones(len(lo), bool)
    new[1:] = lo[1:] > reach[:-1] + np.uint64(slack)
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(lo)) - 1
    return lo[first], reach[last]


def heat(trace, pid: int | None = None, rows: int = 256, cols: int | None = None,
         gap: int = DEFAULT_GAP, metric: str | None = None, only_accessed: bool = False) -> Heat:
    """The heat matrix of one pid's rows of ``trace`` (default: its first pid) for ``metric``
    (``freq`` or ``count``; default: :func:`default_metric`). The address axis is the pid's
    mapped ranges and accessed pages (``only_accessed``: the accessed pages alone), with
    unmapped gaps over ``gap`` bytes collapsed."""
    metric = metric or default_metric(trace)
    if metric not in METRICS:
        raise ConfigError(f"heatmap: unknown metric {metric!r} (use {' or '.join(METRICS)})")
    pids = unique(trace.column("pid"))
    if len(pids) == 0:
        raise ConfigError(f"{trace.path}: the trace has no samples to draw")
    if pid is None:
        pid = int(trace.meta.get("pids", [pids[0]])[0]) if trace.meta.get("pids") else int(pids[0])
        if pid not in pids:
            pid = int(pids[0])
    elif pid not in pids:
        raise ConfigError(f"{trace.path}: no samples of pid {pid} (pids: "
                          f"{', '.join(map(str, pids))})")
    value = trace.column(metric).astype(np.float64)
    sel = (trace.column("pid") == pid) & (value > 0)
    iv = trace.column("interval")[sel]
    t = trace.column("t")[sel]
    page, cnt, unit = _pages_of(trace.column("addr")[sel], trace.column("npages")[sel],
                                value[sel])
    iv, t = iv[unit], t[unit]
    all_iv = trace.column("interval")[trace.column("pid") == pid]
    all_t = trace.column("t")[trace.column("pid") == pid]
    n_iv = int(all_iv.max()) + 1 if len(all_iv) else 1
    # time edges per interval: end times as recorded, starts one interval earlier
    step = trace.interval_s or (float(all_t.max()) / n_iv if len(all_t) else 1.0) or 1.0
    t_end = np.arange(1, n_iv + 1) * step
    for i, tt in zip(all_iv, all_t):
        t_end[i] = tt
    cols = min(cols or n_iv, n_iv)
    col_of_iv = (np.arange(n_iv) * cols) // n_iv
    t_edges = np.concatenate([[0.0], [t_end[col_of_iv == c].max() for c in range(cols)]])
    # the memory there is: accessed pages and (unless only_accessed) the mapped ranges
    used = unique(page)
    maps = np.zeros((0, 2), np.uint64) if only_accessed else mapped_ranges(trace, pid)
    if len(used) == 0 and len(maps) == 0:
        return Heat(np.zeros((1, cols)), t_edges, np.zeros(1, np.uint64), [], [0], pid, 0, metric)
    mem_lo, mem_hi = _merge(np.concatenate([used, maps[:, 0]]),
                            np.concatenate([used + np.uint64(PAGE_SIZE), maps[:, 1]]), 0)
    # segments: memory ranges closer than gap; the unmapped space between them collapses
    seg_lo, seg_hi = _merge(mem_lo, mem_hi, max(gap, PAGE_SIZE) - PAGE_SIZE)
    seg_pages = ((seg_hi - seg_lo) // np.uint64(PAGE_SIZE)).astype(np.int64)
    total = int(seg_pages.sum())
    seg_nrows = _split_rows(seg_pages, max(rows, len(seg_pages)))
    seg_row0 = np.concatenate([[0], np.cumsum(seg_nrows)[:-1]])
    rows = int(seg_nrows.sum())
    s = np.searchsorted(seg_lo, page, side="right") - 1
    in_seg = ((page - seg_lo[s]) // np.uint64(PAGE_SIZE)).astype(np.int64)
    row = seg_row0[s] + (in_seg * seg_nrows[s]) // seg_pages[s]
    m = np.zeros((rows, cols))
    np.add.at(m, (row, col_of_iv[iv]), cnt)
    # mean per page: pages per row times intervals per column; and each row's first address
    row_pages = np.zeros(rows, np.int64)
    row_addr = np.zeros(rows, np.uint64)
    for i in range(len(seg_pages)):
        k = np.arange(seg_nrows[i])
        first = (k * seg_pages[i] + seg_nrows[i] - 1) // seg_nrows[i]
        nxt = np.append(first[1:], seg_pages[i])
        row_pages[seg_row0[i]:seg_row0[i] + seg_nrows[i]] = nxt - first
        row_addr[seg_row0[i]:seg_row0[i] + seg_nrows[i]] = (
            seg_lo[i] + (first * PAGE_SIZE).astype(np.uint64))
    col_ivs = np.bincount(col_of_iv, minlength=cols)
    m /= np.maximum(row_pages, 1)[:, None] * col_ivs[None, :]
    # a row is memory when it overlaps a memory range (the last one starting before its end)
    row_end = row_addr + (row_pages * PAGE_SIZE).astype(np.uint64)
    k = np.searchsorted(mem_lo, row_end, side="left") - 1
    mapped = (k >= 0) & (mem_hi[np.maximum(k, 0)] > row_addr)
    seg_rows = [int(r) for r in seg_row0]
    return Heat(m, t_edges, row_addr, [(int(a), int(b)) for a, b in zip(seg_lo, seg_hi)],
                seg_rows, pid, total, metric, mapped)


def _split_rows(pages: np.ndarray, rows: int) -> np.ndarray:
    """Rows per segment, proportional to its pages, at least one each, at most its pages."""
    total = int(pages.sum())
    want = np.maximum(1, np.minimum(pages, np.floor(pages * rows / total))).astype(np.int64)
    # hand out what rounding left, to the segments with the most pages per row
    while want.sum() < min(rows, total):
        room = want < pages
        if not room.any():
            break
        i = int(np.argmax(np.where(room, pages / want, -1)))
        want[i] += 1
    return want


def ascii_heatmap(h: Heat, title: str = "", width: int = ASCII_WIDTH) -> str:
    """Rows: address, high addresses on top; columns: time. Fits ``width`` columns."""
    label_w = 14
    lines = []
    if title:
        lines.append(title[:width])
    m = h.matrix
    pos = m[m > 0]
    lo, hi = (float(pos.min()), float(pos.max())) if pos.size else (1.0, 1.0)
    span = math.log(hi) - math.log(lo)

    top = len(ASCII_RAMP) - 1

    def ch(v: float) -> str:
        if v <= 0:
            return ASCII_IDLE
        f = (math.log(v) - math.log(lo)) / span if span > 0 else 1.0
        return ASCII_RAMP[min(top, int(f * (top + 0.999)))]

    seg_starts = set(h.seg_rows)
    for r in range(m.shape[0] - 1, -1, -1):
        sep = "~" if (r in seg_starts and r != 0) else "|"
        cells = ("".join(ch(v) for v in m[r]) if h.mapped[r]
                 else ASCII_UNMAPPED * m.shape[1])
        lines.append(f"{hex(int(h.row_addr[r])):>{label_w}} {sep}" + cells)
    ncols = m.shape[1]
    lines.append(" " * label_w + " +" + "-" * ncols)
    t0, t1 = f"{h.t_edges[0]:.0f}", f"{h.t_edges[-1]:.1f} s"
    lines.append(" " * (label_w + 2) + t0 + " " * max(1, ncols - len(t0) - len(t1)) + t1)
    lines.append(f"rows: address, {len(h.segments)} segment(s), '~' = collapsed unmapped gap; "
                 "cols: time")
    legend = (f"'{ASCII_IDLE}' mapped, idle; log scale '{ASCII_RAMP[0]}' {lo:.3g} .. "
              f"'{ASCII_RAMP[-1]}' {hi:.3g} {UNIT_LABEL[h.metric]}")
    lines.append(legend)
    return "\n".join(line[:width] for line in lines)


def png_heatmap(h: Heat, out: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    pos = h.matrix[h.matrix > 0]
    vmin = float(pos.min()) if pos.size else 1e-3
    vmax = float(pos.max()) if pos.size else 1.0
    # mapped but idle: below the scale (the colour map's "under" colour); unmapped: masked
    shown = np.where(h.matrix > 0, h.matrix, vmin / 10)
    m = np.ma.masked_array(shown, mask=np.broadcast_to(~h.mapped[:, None], shown.shape))
    fig, ax = plt.subplots(figsize=(10, 6), dpi=100)
    cmap = matplotlib.colormaps["inferno"].copy()
    cmap.set_bad("#f4f4f4")
    cmap.set_under(IDLE_COLOUR)
    im = ax.imshow(m, aspect="auto", origin="lower", interpolation="nearest", cmap=cmap,
                   norm=LogNorm(vmin=vmin, vmax=max(vmax, vmin * 1.0001)),
                   extent=[float(h.t_edges[0]), float(h.t_edges[-1]), 0, m.shape[0]])
    ticks = list(h.seg_rows)
    labels = [hex(lo) for lo, _ in h.segments]
    for r in h.seg_rows[1:]:
        ax.axhline(r, color="#3aa0ff", lw=0.8, ls="--")
    # a few ticks inside big segments too
    step = max(1, m.shape[0] // 8)
    for r in range(0, m.shape[0], step):
        if all(abs(r - t) >= step // 2 for t in ticks):
            ticks.append(r)
            labels.append(hex(int(h.row_addr[r])))
    # small neighbouring segments: keep one label where several would overlap
    kept, min_gap = [], max(1, m.shape[0] // 40)
    for tk, lb in sorted(zip(ticks, labels)):
        if not kept or tk - kept[-1][0] >= min_gap:
            kept.append((tk, lb))
    ax.set_yticks([tk for tk, _ in kept])
    ax.set_yticklabels([lb for _, lb in kept], fontsize=7, family="monospace")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("virtual address (unmapped gaps collapsed, dashed lines)")
    ax.set_title(title or f"pid {h.pid}", fontsize=10)
    cb = fig.colorbar(im, ax=ax, extend="min")
    cb.set_label(("count per 4 KiB page per interval" if h.metric == "count" else
                  "estimated accesses/s of the page's unit")
                 + " (log scale; darkest: mapped, idle)")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def title_of(trace, pid: int) -> str:
    m = trace.meta
    mode = f" ({m['mode']})" if m.get("mode") else ""
    cmd = m.get("command") or ""
    return f"{m.get('backend')}{mode} pid {pid}: {cmd}"[:78]
