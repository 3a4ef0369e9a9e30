"""The fast node's room: the targets' budget on it and what it can take before its high watermark.

The daemon asks :meth:`FastNode.budget_pages` and :meth:`FastNode.room_pages` before each
decision, and the room again after its demotions, before the promotions that may use what
they freed (daemon/moves.py). Sizes are 4 KiB pages; the node's files are read from the
configuration's ``node_root`` (its meminfo) and ``zoneinfo``.
"""
from __future__ import annotations

from typing import Callable

from pagetier.core.state import PageState
from pagetier.core.units import MB, PAGE_SIZE
from pagetier.daemon import config as config_mod

# promotions leave this much above the fast node's high watermark: below the watermark
# move_pages reclaims and retries page by page before it answers ENOMEM, and other tenants
# allocate between the daemon's reading of the room and its moves
ROOM_MARGIN = 1 * MB
NO_LIMIT = 1 << 62
# what the room reads of /proc/zoneinfo: the high watermark and the per-CPU lists' free pages
ZONE_FIELDS = ("high", "count:")


class FastNode:
    """The budget and room of ``cfg().fast_node`` (``cfg``: the daemon's current
    configuration, which a reload replaces) for the targets in ``state``."""

    def __init__(self, cfg: Callable, state: PageState):
        self.cfg, self.state = cfg, state
        # the fast node's per-CPU free pages before the daemon's demotions (None: not read
        # yet), the demoted pages that may still wait on those lists, and the pages demoted
        # since the last room read
        self._pcp_base: int | None = None
        self._pcp_ours = 0
        self._demoted_unread = 0
        self.detail: list[dict] = []  # this step's readings of the room (stats: "fast_room")

    def begin_step(self) -> None:
        """A new step: its room readings start afresh."""
        self.detail = []

    def demoted(self, pages: int) -> None:
        """The daemon demoted ``pages`` off the fast node (they may wait on its per-CPU lists)."""
        self._demoted_unread += pages

    def budget_pages(self) -> int:
        """Movable pages the targets may keep on the fast node: the configured ``fast_budget``,
        else what stays free above ``fast_free_watermark`` plus what they hold, else the node's
        size (no limit when unknown)."""
        cfg = self.cfg()
        if cfg.fast_budget is not None:
            return cfg.fast_budget // PAGE_SIZE
        try:
            info = config_mod.node_meminfo(cfg.fast_node, cfg.node_root)
        except (OSError, ValueError):
            return NO_LIMIT
        if cfg.fast_free_watermark is not None:
            spare = max(0, info.get("MemFree", 0) - cfg.fast_free_watermark) // PAGE_SIZE
            return self.state.movable_on(cfg.fast_node) + spare
        total = info.get("MemTotal")
        return total // PAGE_SIZE if total else NO_LIMIT

    def room_pages(self) -> int | None:
        """Pages the fast node can take before its free memory reaches its high watermark (plus
        ROOM_MARGIN); None when unknown. Below the watermark, move_pages reclaims and retries for
        every page before it answers ENOMEM: minutes under memory pressure, so the daemon does
        not promote into a node that has no room.

        Pages demoted from the fast node since the last call (:meth:`demoted`): the kernel
        frees a migrated page to the freeing CPU's per-CPU list, which MemFree leaves out until
        it drains (a demotion of 4 huge pages to a node near its watermark leaves MemFree
        unchanged and raises the lists' count by 2,048); the daemon's next allocations on that
        CPU take from that list first. So the lists' growth since before the daemon's
        demotions counts as room, up to the pages demoted, and shrinks as the lists drain or
        are taken from: an exchange's promotions find the room its demotions made, in the same
        interval or a later one."""
        cfg = self.cfg()
        fast = cfg.fast_node
        try:
            free = config_mod.node_memfree(fast, cfg.node_root)
            zones = config_mod.zone_sums(fast, config_mod.read_bytes(cfg.zoneinfo).decode(),
                                         ZONE_FIELDS)  # one walk for both
            high = config_mod.zone_watermark(fast, "high", page_size=PAGE_SIZE, sums=zones)
            pcp = config_mod.zone_pcp_pages(fast, sums=zones)
        except (OSError, KeyError, ValueError):
            return None
        demoted, self._demoted_unread = self._demoted_unread, 0
        if self._pcp_base is not None:
            self._pcp_ours = min(self._pcp_ours + demoted, max(0, pcp - self._pcp_base))
        if not self._pcp_ours:
            self._pcp_base = pcp  # none of the daemon's pages there: the base follows the lists
        room = (free - high - ROOM_MARGIN) // PAGE_SIZE + self._pcp_ours
        # what the room was made of, in 4 KiB pages
        self.detail.append({"free": free // PAGE_SIZE, "high": high // PAGE_SIZE,
                            "pcp": pcp, "pcp_ours": self._pcp_ours, "room": room})
        return room
