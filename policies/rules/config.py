"""The default policy's options (``Heuristic.Config``): one field per option, with its check.

Each option belongs to one rule (policies/rules/__init__.py lists them); the comment beside
it says what it sets.
"""
from __future__ import annotations

from dataclasses import dataclass

from pagetier.errors import ConfigError


def option_error(policy: str, config):
    """``bad(key, why)``: raises the one-line error for option ``key`` of ``config``."""
    def bad(key: str, why: str):
        raise ConfigError(f"policy {policy}: option {key!r} {why}, got {getattr(config, key)!r}")

    return bad


def check_shared(config, bad) -> None:
    """The options heuristic and sentinel both take: min_heat >= 0 and the watermarks,
    0 < low <= high <= 1."""
    if not config.min_heat >= 0:
        bad("min_heat", "must be >= 0")
    if not 0 < config.high_watermark <= 1:
        bad("high_watermark", "must be in (0, 1]")
    if not 0 < config.low_watermark <= config.high_watermark:
        bad("low_watermark", f"must be in (0, high_watermark={config.high_watermark}]")


@dataclass
class Config:
    min_heat: float = 1.0  # colder units are never promoted
    high_watermark: float = 1.0  # fraction of the budget: above it, demote...
    low_watermark: float = 0.95  # ...down to this; the hot set is sized to it
    min_residency: int = 2  # intervals a moved unit stays where it was moved
    margin: float = 0.25  # a swap needs promoted heat > victim heat * (1 + margin)...
    gap_ratio: float = 0.1  # ...and promoted - victim heat >= gap_ratio * reference heat
    exchange_ratio: float = 0.25  # ...and promoted heat >= exchange_ratio * hot set's median
    sustained_exchange: bool = True  # ...now and before this interval's read
    one_read_ratio: float = 0.75  # ...unless this read puts it at this * the median (0: off)
    sustained_fill: bool = True  # free room is filled on two reads too: a warm unit...
    fill_ratio: float = 0.15  # ...at least fill_ratio * the hot set's median heat
    young_ratio: float = 0.4  # on a young read a unit moves only at this * median heat
    noise_ratio: float = 0.05  # colder than noise_ratio * reference heat: noise, not promoted
    ref_mass: float = 0.9  # the reference heat: the coldest unit of those carrying this share
    thrash_window: int = 4  # a move within this many intervals of the last is a move-back
    thrash_ratio: float = 0.05  # move-backs / moves above which the policy throttles
    throttle_scale: float = 0.25  # fraction of max_moves exchanges use while throttled
    thrash_margin: float = 3.0  # while throttled, exchanges need this margin
    freeze_ratio: float = 0.5  # move-backs under the throttle above it: freeze recent movers
    history: int = 8  # intervals of hot-set overlap kept to classify the pattern
    regular_jaccard: float = 0.6  # mean overlap at or above it: a regular pattern
    phase_jaccard: float = 0.3  # overlap below it after a regular run: a phase change...
    phase_mass: float = 0.5  # ...with under this share of the read's accesses on the last set
    phase_stay: float = 0.3  # ...and under this share of its pages still at their rate (0: off)
    phase_core: bool = True  # the pattern from the hot units at the exchange bar only (phase)
    follow_change: bool = True  # moves finishing a phase change's exchange: no move-backs
    finish_change: bool = True  # ...and that exchange completed on the read's rates (finish.py)
    held_reads: int = 2  # after an irregular run: reads since the last change on its set (phase)
    look_between_reads: bool = True  # a phase change read at the period end that shows it (phase)
    young_corrections: bool = True  # moving back what a young read moved: no move-back (residency)
    per_page: bool = True  # rank units by heat per page (False: by each unit's heat)
    sparse: bool = True  # on sparse evidence, decide on rates across reads (rules/sparse.py)...
    sparse_samples: float = 1.3  # ...sparse: half the samples from units seen < this a read
    sparse_decay: float = 0.9  # ...each read's samples count this much less a read later
    sparse_z: float = 1.0  # ...confidence bounds this many standard deviations out
    sparse_region: int = 512  # ...pages of a region whose samples its units share (0: none)
    sparse_region_weight: float = 8.0  # ...times the region's rate per page a unit is lent
    sparse_region_fit: bool = True  # ...that weight chosen per read by how well it predicts

    def check(self):
        bad = option_error("heuristic", self)
        check_shared(self, bad)
        if self.min_residency < 0:
            bad("min_residency", "must be >= 0")
        if not self.margin >= 0:
            bad("margin", "must be >= 0")
        if not self.gap_ratio >= 0:
            bad("gap_ratio", "must be >= 0")
        if not 0 <= self.exchange_ratio <= 1:
            bad("exchange_ratio", "must be in [0, 1]")
        if not 0 <= self.noise_ratio < 1:
            bad("noise_ratio", "must be in [0, 1)")
        if not self.one_read_ratio >= 0:
            bad("one_read_ratio", "must be >= 0")
        if not 0 <= self.fill_ratio <= 1:
            bad("fill_ratio", "must be in [0, 1]")
        if not 0 <= self.young_ratio <= 1:
            bad("young_ratio", "must be in [0, 1]")
        if not 0 < self.ref_mass <= 1:
            bad("ref_mass", "must be in (0, 1]")
        if self.thrash_window < self.min_residency:
            bad("thrash_window", f"must be >= min_residency={self.min_residency}")
        if not 0 < self.thrash_ratio <= 1:
            bad("thrash_ratio", "must be in (0, 1]")
        if not 0 < self.throttle_scale <= 1:
            bad("throttle_scale", "must be in (0, 1]")
        if not self.thrash_margin >= self.margin:
            bad("thrash_margin", f"must be >= margin={self.margin}")
        if not 0 < self.freeze_ratio <= 1:
            bad("freeze_ratio", "must be in (0, 1]")
        if self.history < 2:
            bad("history", "must be >= 2")
        if not 0 <= self.regular_jaccard <= 1:
            bad("regular_jaccard", "must be in [0, 1]")
        if not 0 < self.phase_mass <= 1:
            bad("phase_mass", "must be in (0, 1]")
        if not 0 <= self.phase_stay <= 1:
            bad("phase_stay", "must be in [0, 1]")
        if self.held_reads < 1:
            bad("held_reads", "must be >= 1")
        if not self.sparse_samples >= 0:
            bad("sparse_samples", "must be >= 0")
        if not 0 < self.sparse_decay < 1:
            bad("sparse_decay", "must be in (0, 1)")
        if self.sparse_region < 0 or (self.sparse_region & (self.sparse_region - 1)):
            bad("sparse_region", "must be 0 or a power of two (pages)")
        if not self.sparse_region_weight >= 0:
            bad("sparse_region_weight", "must be >= 0")
        if not self.sparse_z >= 0:
            bad("sparse_z", "must be >= 0")
        if not 0 <= self.phase_jaccard <= self.regular_jaccard:
            bad("phase_jaccard", f"must be in [0, regular_jaccard={self.regular_jaccard}]")
