"""Rule 3, watermarks: how much of the fast node the policy fills, and when it must demote.

The hot set is sized to ``low_watermark`` times the budget; promotions fill up to
``high_watermark`` times it. Fast-node use above the high watermark is demoted down to the low
one, whatever the promotions. The fast node itself may hold less than the budget
(``Context.fast_capacity``: the targets' units on it plus its room): that limits promotions
only, and never makes the policy demote (the daemon does not give memory to other tenants).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capacity:
    """Pages of the fast node the policy plans for: ``budget`` and its watermarks
    (``budget_low``, ``budget_high``), the node's own room ``node`` (None: no limit), and the
    lower of the two at each watermark (``low``: the hot set; ``high``: what promotions fill)."""

    budget: int
    budget_low: int
    budget_high: int
    node: int | None
    low: int
    high: int

    @classmethod
    def of(cls, ctx, c) -> "Capacity":
        budget = max(0, int(ctx.fast_budget))
        low, high = int(budget * c.low_watermark), int(budget * c.high_watermark)
        node = None if ctx.fast_capacity is None else max(0, int(ctx.fast_capacity))
        if node is None:
            return cls(budget, low, high, None, low, high)
        return cls(budget, low, high, node, min(low, node), min(high, node))

    @property
    def node_bound(self) -> bool:
        """Whether the node, not the budget, is what limits promotions."""
        return self.node is not None and self.node < self.budget_high

    @property
    def holds(self) -> int:
        """What the fast node can hold for the policy: the budget, or the node's room if less."""
        return min(self.budget, self.node if self.node is not None else self.budget)

    def must(self, used: int) -> int:
        """Pages to demote whatever the promotions: down to the low watermark when ``used`` is
        above the high one."""
        return used - self.budget_low if used > self.budget_high else 0
