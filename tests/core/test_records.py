"""ckptpub's run-time ``NamedTuple`` builds what ``typing.NamedTuple`` builds for the same class body."""

from __future__ import annotations

import pickle
import typing

import pytest

from ckptpub.records import NamedTuple

#: One class body, built on ckptpub's NamedTuple and on typing's, so the two cannot drift apart.
RECORD_SOURCE = '''
from __future__ import annotations

class {name}(Base):
    """A record."""

    path: str
    size: int
    tags: tuple[str, ...] = ()
    note: str | None = None

    @property
    def label(self) -> str:
        return f"{{self.path}}:{{self.size}}"

    def grown(self, by: int):
        return self._replace(size=self.size + by)
'''


def _record_class(name: str, base: type) -> type:
    namespace: dict = {"Base": base, "__name__": __name__}
    exec(RECORD_SOURCE.format(name=name), namespace)
    return namespace[name]


Light = _record_class("Light", NamedTuple)
Typed = _record_class("Typed", typing.NamedTuple)


@pytest.mark.parametrize(
    "args, kwargs", [(("a", 1), {}), (("a", 1, ("x",)), {"note": "n"}), ((), {"path": "b", "size": 2})]
)
def test_same_behaviour_as_typing(args: tuple, kwargs: dict) -> None:
    light, typed = Light(*args, **kwargs), Typed(*args, **kwargs)
    assert tuple(light) == tuple(typed) and light == typed and hash(light) == hash(typed)
    assert Light._fields == Typed._fields and Light._field_defaults == Typed._field_defaults
    assert repr(light) == repr(typed).replace("Typed(", "Light(")
    assert light.label == typed.label and tuple(light.grown(3)) == tuple(typed.grown(3))
    assert type(light.grown(3)) is Light and type(Light._make(tuple(light))) is Light
    assert light._asdict() == typed._asdict()
    assert pickle.loads(pickle.dumps(light)) == light and type(pickle.loads(pickle.dumps(light))) is Light
    assert Light.__doc__ == Typed.__doc__ == "A record." and Light.__module__ == Typed.__module__ == __name__
    assert not hasattr(light, "__dict__"), "records stay as small as tuples"
    with pytest.raises(AttributeError):
        light.size = 5  # type: ignore[misc]


def test_missing_arguments_fail_like_typing() -> None:
    with pytest.raises(TypeError):
        Light("only-path")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Typed("only-path")  # type: ignore[call-arg]


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="'b' without a default follows"):
        exec(
            "class Bad(NamedTuple):\n    a: int = 0\n    b: int\n",
            {"NamedTuple": NamedTuple, "__name__": "m"},
        )


def test_evaluated_annotations_are_refused_rather_than_misread() -> None:
    """Without ``from __future__ import annotations`` Python 3.14 keeps no ``__annotations__`` in the class body."""
    namespace = {"__module__": "m", "__qualname__": "Bad", "__annotate__": lambda format: {"a": int}}
    with pytest.raises(TypeError, match="from __future__ import annotations"):
        type(NamedTuple)("Bad", (NamedTuple,), namespace)
