"""Implementations chosen by name (schedulers, cost sources, executors, vendor libraries): each kind keeps
a table of its classes, filled by a class decorator that also gives the class its `name`."""

from __future__ import annotations


def registrar(table: dict[str, type]):
    """The decorator factory of `table`: `@register(name)` files a class under `name` and sets its `name`."""
    def register(name: str):
        def file(cls: type) -> type:
            table[name] = cls
            cls.name = name
            return cls
        return file
    return register
