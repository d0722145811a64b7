"""A config file's values read as the types their settings declare, and a value of the wrong type named.

YAML reads ``1e-4`` as a string (YAML 1.1 wants a dot in a float: ``1.0e-4``), and RLlib then refuses ``lr='1e-4'``
with a message about schedules that names neither the string nor the setting. The declared type of
``SECTION.KEY`` is the annotation of ``KEY`` in ``P3OConfig.SECTION`` (P3O's settings, `rllib_p3o.core.settings`,
and RLlib's own arguments): a string where the setting takes a number and no string is read as that number, and a
value that fits none of the declared types is an error naming the setting, the value and the types it takes.

Only what the annotation says for certain is judged: ``Any``, callables, classes and annotations that do not resolve
pass as they are.
"""

from __future__ import annotations

import collections.abc
import inspect
import sys
import typing
from typing import Any, Optional, Tuple

# A declared type that cannot be judged here (unresolved, Any, a callable, a class of the user's).
UNKNOWN = object()
_NONE = type(None)
_LISTS = (list, collections.abc.Sequence, collections.abc.MutableSequence)
_DICTS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def declared_type(config_class: type, section: str, key: str) -> Any:
    """The annotation of ``key`` in ``config_class.<section>(...)``: the first class of the MRO whose method names
    the keyword (P3O's ``training`` takes RLlib's keywords through ``**kwargs``). `UNKNOWN` when no method names it
    or its annotation does not resolve."""
    for klass in config_class.__mro__:
        method = klass.__dict__.get(section)
        if method is None:
            continue
        parameter = inspect.signature(method).parameters.get(key)
        if parameter is None or parameter.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        return _resolved(parameter.annotation, method)
    return UNKNOWN


def _resolved(annotation: Any, method: Any) -> Any:
    if annotation is inspect.Parameter.empty:
        return UNKNOWN
    if isinstance(annotation, str):  # a module with ``from __future__ import annotations``
        namespace = dict(vars(sys.modules[method.__module__]))
        namespace.update(vars(typing))
        try:
            return eval(annotation, namespace)  # noqa: S307 (an annotation of this package or of RLlib)
        except Exception:
            return UNKNOWN
    return annotation


def as_declared(value: Any, hint: Any) -> Any:
    """``value`` with the strings YAML left where ``hint`` takes a number (and no string) read as that number, in
    lists and mappings too; anything else unchanged."""
    if hint is UNKNOWN:
        return value
    arms = _arms(hint)
    if isinstance(value, str) and str not in arms:
        number = _number(value, arms)
        return value if number is None else number
    for arm in arms:
        origin, args = typing.get_origin(arm), typing.get_args(arm)
        if isinstance(value, list) and origin in (*_LISTS, tuple) and args:
            if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
                if len(args) == len(value):
                    return [as_declared(v, a) for v, a in zip(value, args)]
                continue
            return [as_declared(v, args[0]) for v in value]
        if isinstance(value, dict) and origin in _DICTS and len(args) == 2:
            return {k: as_declared(v, args[1]) for k, v in value.items()}
    return value


def type_problem(value: Any, hint: Any) -> Optional[str]:
    """None when ``value`` fits ``hint`` (or ``hint`` cannot be judged), else the types it takes, in words."""
    if hint is UNKNOWN or _fits(value, hint):
        return None
    return describe(hint)


def describe(hint: Any) -> str:
    """A declared type in words: ``Optional[float]`` is "a number or null"."""
    words = []
    for arm in _arms(hint):
        origin = typing.get_origin(arm) or arm
        word = _WORDS.get(origin) or next((w for kinds, w in _CONTAINER_WORDS if origin in kinds), None)
        if word is None:
            word = getattr(arm, "__name__", None) or str(arm)
        if word not in words:
            words.append(word)
    return ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]


_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", _NONE: "null"}
_CONTAINER_WORDS: Tuple[Tuple[tuple, str], ...] = ((_LISTS + (tuple,), "a list"), (_DICTS, "a mapping"))


def _arms(hint: Any) -> Tuple[Any, ...]:
    """The alternatives of a Union (Optional included), flattened; the hint itself otherwise."""
    if typing.get_origin(hint) is typing.Union:
        return tuple(a for arg in typing.get_args(hint) for a in _arms(arg))
    return (hint,)


def _number(text: str, arms: Tuple[Any, ...]) -> Any:
    """``text`` as the int or float ``arms`` take (an int where both are taken and it is whole), else None."""
    for kind in (int, float):
        if kind in arms:
            try:
                return kind(text.strip())
            except ValueError:
                continue
    return None


def _fits(value: Any, hint: Any) -> bool:
    for arm in _arms(hint):
        if arm is Any or arm is UNKNOWN:
            return True
        if arm is _NONE:
            if value is None:
                return True
            continue
        if arm is bool:
            if isinstance(value, bool):
                return True
            continue
        if arm is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
            continue
        if arm is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
            continue
        if arm is str:
            if isinstance(value, str):
                return True
            continue
        origin = typing.get_origin(arm) or arm
        if origin in _LISTS + (tuple,):
            if isinstance(value, (list, tuple)):
                return True  # (the elements are the setting's own validation's)
            continue
        if origin in _DICTS:
            if isinstance(value, dict):
                return True
            continue
        return True  # a class, a callable, a Literal...: not judged here
    return False
