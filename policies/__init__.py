"""Placement policies behind one interface, chosen by name (see base.py)."""
from pagetier.policies.base import POLICIES, Context, Decision, Policy, create, register  # noqa: F401
