"""The one memo helper: bounded, keyed by value, safe under the app server's threads.

Every cache in calc/ is a `Memo`. A key is a value (a tuple of ints, strings, enums, frozen models), never an
`id()`: an id is reused once its object is freed, and an id-keyed entry then answers for another object.
A full memo forgets its least recently used entry. The lock guards the dictionary only; `make()` runs outside it,
so two threads asking for the same new key may both compute it (the values are equal: estimates are pure), and
neither waits on the other's work.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING = object()


class Memo(Generic[K, V]):
    """A least-recently-used memo of at most `max_entries` values; `name` says what it holds (for `stats`)."""

    _all: list[Memo] = []

    def __init__(self, name: str, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("a memo holds at least one entry")
        self.name = name
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        Memo._all.append(self)

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value for `key`, made by `make()` the first time it is asked (and again after it was forgotten)."""
        with self._lock:
            value = self._entries.get(key, _MISSING)
            if value is not _MISSING:
                self._entries.move_to_end(key)
                self.hits += 1
                return value  # type: ignore[return-value]
            self.misses += 1
        value = make()
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


def memoized(name: str, max_entries: int) -> Callable[[Callable[..., V]], Callable[..., V]]:
    """A decorator: the function's results memoized by its positional arguments (which must be hashable values)."""

    def wrap(fn: Callable[..., V]) -> Callable[..., V]:
        memo: Memo[tuple, V] = Memo(name, max_entries)

        def memoized_fn(*args: Hashable) -> V:
            return memo.get(args, lambda: fn(*args))

        memoized_fn.__name__ = fn.__name__
        memoized_fn.__qualname__ = fn.__qualname__
        memoized_fn.__doc__ = fn.__doc__
        memoized_fn.memo = memo  # type: ignore[attr-defined]
        return memoized_fn

    return wrap


def clear_all() -> None:
    """Forget every memo's entries (tests and benchmarks that time cold estimates)."""
    for memo in Memo._all:
        memo.clear()


def stats() -> dict[str, tuple[int, int, int]]:
    """name -> (entries, hits, misses) for every memo."""
    return {m.name: (len(m), m.hits, m.misses) for m in Memo._all}
