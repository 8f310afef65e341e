"""A trace file's budget (docs/devices.md): how deep a JSON or pickle may nest, how many clients and online
intervals it may hold, and no key given twice. Checked while the file is read, so a pickle nested deep enough
to take the interpreter down, or whose shared references repeat one list for every client, is refused naming
the limit before anything is expanded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MAX_CLIENTS", "MAX_DEPTH", "MAX_INTERVALS", "Repeated", "unique_keys", "within_budget"]

#: FedScale's traces nest 4 deep (clients, record, list, time)
MAX_DEPTH = 16
#: clients (records) read from one trace
MAX_CLIENTS = 10_000_000
#: online intervals read from one trace, in all (160 MB as float64 starts and ends)
MAX_INTERVALS = 10_000_000


class Repeated(ValueError):
    """A JSON object named one key twice; carries the key."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object (``json.load``'s ``object_pairs_hook``); a key given twice, which json would silently
    resolve to the last, raises :class:`Repeated`."""
    out = dict(pairs)
    if len(out) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise Repeated(key)
            seen.add(key)
    return out


def within_budget(data: Any, err: Callable[[str], Exception]) -> Any:
    """``data``, once no container in it nests deeper than :data:`MAX_DEPTH` (else ``err(what)`` is raised).
    Each distinct container is visited once, so shared references are not expanded, and without recursion."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        if not isinstance(obj, (dict, list, tuple, set, frozenset)) or id(obj) in seen:
            continue
        if depth > MAX_DEPTH:
            raise err(f"nests deeper than {MAX_DEPTH} levels; a trace is a dict or list of records of numbers "
                      "and lists of numbers (4 levels)")
        seen.add(id(obj))
        items = [*obj.keys(), *obj.values()] if isinstance(obj, dict) else obj
        stack.extend((item, depth + 1) for item in items)
    return data
