"""``NamedTuple`` for ckptpub's record types, without importing :mod:`typing` at run time.

Every ``ckptpub`` command is a fresh process, and verifying a 2 GB checkpoint takes
about a quarter of a second, so start-up is part of every run: importing ``typing``
costs about 2.5 ms of it (1%), and the CLI needed it for nothing but ``NamedTuple``.

Modules import ``NamedTuple`` from here and write their records as usual::

    from .records import NamedTuple

    class Span(NamedTuple):
        path: str
        size: int = 0

Type checkers read ``typing.NamedTuple`` (the ``TYPE_CHECKING`` branch below). At
run time the same class statement builds what ``typing.NamedTuple`` builds: a
``collections.namedtuple`` with the annotated fields in order, the defaults, and
the methods, properties and docstring of the class body. Field names come from
``__annotations__``, so a module that uses this needs ``from __future__ import
annotations`` (every ckptpub module has it), which keeps annotations as strings
that are never evaluated. ``tests/core/test_records.py`` holds the two side by side.
"""

from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: checkers treat the name alike


class _NamedTupleMeta(type):
    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, object]) -> type:
        if not bases:  # the NamedTuple base below
            return super().__new__(mcls, name, bases, namespace)
        annotations = namespace.get("__annotations__")
        if not isinstance(annotations, dict):
            raise TypeError(f"{name}: records need 'from __future__ import annotations' in their module")
        fields = list(annotations)
        defaults = []
        for field in fields:
            if field in namespace:
                defaults.append(namespace.pop(field))
            elif defaults:
                raise TypeError(f"{name}: field {field!r} without a default follows a field with one")
        tuple_type = namedtuple(name, fields, defaults=defaults, module=str(namespace["__module__"]))
        return type(name, (tuple_type,), {**namespace, "__slots__": ()})


if TYPE_CHECKING:
    from typing import NamedTuple as NamedTuple
else:

    class NamedTuple(metaclass=_NamedTupleMeta):
        """Subclass with annotated fields to get a ``collections.namedtuple`` (see the module docstring)."""
