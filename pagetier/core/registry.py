"""Name registries for pluggable classes (policies, profiler backends)."""
from __future__ import annotations


def registrar(table: dict):
    """A decorator factory for ``table``: ``@register("name")`` sets the class's ``name`` and
    files the class under it."""

    def register(name: str):
        def deco(cls):
            cls.name = name
            table[name] = cls
            return cls

        return deco

    return register
