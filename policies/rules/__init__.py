"""The default policy's rules (policies/heuristic.py puts them together), one module each:

1. ``noise``: the reference heat and the noise floor; units under it are never promoted.
2. ``hotset``: the units above the floor, ranked (per page), that fit the capacity.
3. ``capacity``: the watermarks: the capacity planned for, and what must be demoted.
4. ``exchange``: the exchange bar: which candidates may push a resident out.
5. ``fill``: which candidates may take free room.
6. ``young``: on a read of first estimates, only clearly hot units move.
7. ``residency``: hysteresis, and which moves count as move-backs.
8. ``throttle``: move-backs and oversubscription make exchanges rarer and smaller.
9. ``phase``: the access pattern, and a new hot set acted on in the interval it is seen.
10. ``victims``: which fast units make room, in what order.

``plan`` turns the verdicts into moves, ``planner`` holds the two helpers every ranking
policy shares (``fill_budget``, ``plan_moves``), ``arrays`` the numeric helpers, ``config``
the options, ``cool`` which candidates far under the last noise floor the decision leaves out
of its work on each unit (the ranking shows they change nothing), and ``view`` is the one
place that reads a PageState.
"""
