"""The micro-batch B and the sequence length S as symbols, so a block is recorded once for every shape.

Every tensor a block creates has a size that is a product of dimensions, a polynomial in (B, S)
(B*S*h, B*heads*S*S, 8*B*(S+1), ...). A block builder (calc.sim.layers) run on a context whose batch and
seq are `Dim`s records those polynomials instead of numbers; the simulator (calc.sim.graph) turns them into
a plan evaluated for any (B, S). Where the builder asks something a polynomial cannot answer (a
comparison, `seq >= sliding_window`; a division that is not exact; a function such as Liger's chunk
size, through `fixed`), the answer at the recorded shape is used and kept as a guard: the recording
serves another (B, S) only where every guard gives the same answer again (as torch.compile's dynamic
shapes do). What holds for one shape only (a floor division that is not exact, B*S // tp under
sequence parallelism) raises Unsupported, and the block is then replayed for each shape.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import NamedTuple, TypeVar

R = TypeVar("R")
Mono = tuple[int, int]  # powers of (B, S)
Poly = dict[Mono, int]  # coefficient of each monomial, none zero


class Unsupported(TypeError):
    """An operation on a symbolic dimension that no guard can stand for."""


Term = tuple[int, int, int]  # (coefficient, power of B, power of S)
Terms = tuple[Term, ...] | int  # a polynomial's terms in a fixed order, or a constant


def terms(poly: Poly | int) -> Terms:
    """A polynomial as (coefficient, power of B, power of S) terms, in a fixed order; a constant as it is."""
    if isinstance(poly, int):
        return poly
    return tuple(sorted((c, b, s) for (b, s), c in poly.items()))


def evaluate(poly_terms: Terms, batch: int, seq: int) -> int:
    """The value at (batch, seq) of a polynomial's terms (or of a constant)."""
    if isinstance(poly_terms, int):
        return poly_terms
    return sum(c * batch ** b * seq ** s for c, b, s in poly_terms)


class Check(NamedTuple):
    """A guard by value: fn(*args evaluated at (B, S)) == expected."""

    fn: Callable[..., object]
    args: tuple[Terms, ...]
    expected: object

    def holds(self, batch: int, seq: int) -> bool:
        return self.fn(*[evaluate(a, batch, seq) for a in self.args]) == self.expected


class Guard:
    """fn(*polys evaluated at (B, S)) == expected: one answer the recording depends on (Trace.holds asks them)."""

    __slots__ = ("fn", "polys", "expected")

    def __init__(self, fn: Callable[..., object], polys: tuple[Poly | int, ...], expected: object) -> None:
        self.fn, self.polys, self.expected = fn, polys, expected

    def check(self) -> Check:
        return Check(self.fn, tuple(terms(p) for p in self.polys), self.expected)


class Trace:
    """The symbols B and S of one recording, at the shape it is recorded for, and its guards."""

    def __init__(self, batch: int, seq: int) -> None:
        self.guards: list[Guard] = []
        self.batch = Dim({(1, 0): 1}, batch, self)
        self.seq = Dim({(0, 1): 1}, seq, self)
        self._checks: dict[Check, None] = {}  # the distinct guards, first asked first
        self._checked = 0  # how many of the guards are among the checks

    def holds(self, batch: int, seq: int) -> bool:
        """Every guard gives its recorded answer at (batch, seq). Asked for every new shape: each distinct guard
        once (a builder often asks the same question twice), the guards added since the last call made checks
        first."""
        if self._checked != len(self.guards):
            self._checks.update(dict.fromkeys(g.check() for g in self.guards[self._checked:]))
            self._checked = len(self.guards)
        return not self._checks or all(check.holds(batch, seq) for check in self._checks)


def _poly(x: int) -> Poly:
    return {(0, 0): x} if x else {}


def accumulate(out: dict, other: dict, sign: int = 1) -> dict:
    """Add sign * other into the sparse sum `out` in place (a polynomial's monomials, a byte form's terms),
    dropping terms that cancel to 0."""
    for k, c in other.items():
        v = out.get(k, 0) + sign * c
        if v:
            out[k] = v
        else:
            out.pop(k, None)
    return out


def _add(p: Poly, q: Poly, sign: int = 1) -> Poly:
    return accumulate(dict(p), q, sign)


def _mul(p: Poly, q: Poly) -> Poly:
    out: Poly = {}
    for (b1, s1), c1 in p.items():
        # one term of p times q: distinct monomials, summed into the product
        accumulate(out, {(b1 + b2, s1 + s2): c1 * c2 for (b2, s2), c2 in q.items()})
    return out


def _div_exact(p: Poly, q: Poly) -> Poly | None:
    """p / q when q is one term that divides every term of p exactly (B*nh*S*S / S), else None."""
    if len(q) != 1:
        return None
    ((qb, qs), qc), = q.items()
    out: Poly = {}
    for (b, s), c in p.items():
        if b < qb or s < qs or c % qc:
            return None
        out[(b - qb, s - qs)] = c // qc
    return out


def as_poly(x: Dim | int) -> Poly:
    """The polynomial of a size (an int is a constant)."""
    if isinstance(x, Dim):
        return x.poly
    if isinstance(x, int):
        return _poly(x)
    raise Unsupported(f"a size must be an integer or a Dim, not {type(x).__name__}")


def value_of(x: Dim | int) -> int:
    return x.value if isinstance(x, Dim) else x


class Dim:
    """An integer that is a polynomial in (B, S), with its value at the recorded shape."""

    __slots__ = ("poly", "value", "trace")
    __hash__ = None  # type: ignore[assignment]  # equality is a guard, not an identity

    def __init__(self, poly: Poly, value: int, trace: Trace) -> None:
        self.poly, self.value, self.trace = poly, value, trace

    def _new(self, poly: Poly, value: int) -> Dim | int:
        if not poly or list(poly) == [(0, 0)]:
            return value  # a constant is an int again
        return Dim(poly, value, self.trace)

    def _guard(self, fn: Callable[..., R], *args: Dim | int) -> R:
        expected = fn(*map(value_of, args))
        self.trace.guards.append(Guard(fn, tuple(a.poly if isinstance(a, Dim) else a for a in args), expected))
        return expected

    def __add__(self, other: Dim | int) -> Dim | int:
        return self._new(_add(self.poly, as_poly(other)), self.value + value_of(other))

    __radd__ = __add__

    def __sub__(self, other: Dim | int) -> Dim | int:
        return self._new(_add(self.poly, as_poly(other), -1), self.value - value_of(other))

    def __rsub__(self, other: int) -> Dim | int:
        return self._new(_add(as_poly(other), self.poly, -1), value_of(other) - self.value)

    def __neg__(self) -> Dim | int:
        return self._new(_add({}, self.poly, -1), -self.value)

    def __mul__(self, other: Dim | int) -> Dim | int:
        return self._new(_mul(self.poly, as_poly(other)), self.value * value_of(other))

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim | int) -> Dim | int:
        exact = _div_exact(self.poly, as_poly(other)) if value_of(other) else None
        if exact is None:  # B*S // tp: a quotient of this shape only
            raise Unsupported("a floor division that is not exact")
        return self._new(exact, self.value // value_of(other))

    def __lt__(self, other: Dim | int) -> bool:
        return self._guard(operator.lt, self, other)

    def __le__(self, other: Dim | int) -> bool:
        return self._guard(operator.le, self, other)

    def __gt__(self, other: Dim | int) -> bool:
        return self._guard(operator.gt, self, other)

    def __ge__(self, other: Dim | int) -> bool:
        return self._guard(operator.ge, self, other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dim | int):
            return NotImplemented
        return self._guard(operator.eq, self, other)

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, Dim | int):
            return NotImplemented
        return self._guard(operator.ne, self, other)

    def __bool__(self) -> bool:
        """Whether the size is not 0: a guard, unless every coefficient has one sign (16384 * B * S, a block's
        scratch bytes), which no B, S >= 1 makes 0, so that the answer holds for every shape."""
        if all(c > 0 for c in self.poly.values()) or all(c < 0 for c in self.poly.values()):
            return True
        return self._guard(bool, self)

    def __repr__(self) -> str:
        return f"Dim({self.poly}, value={self.value})"


def fixed(fn: Callable[..., int], *args: Dim | int) -> int:
    """fn(*args) for a function of sizes that is no polynomial (Liger's chunk of tokens): its answer at the
    recorded shape, which the recording then keeps only where fn answers the same."""
    for a in args:
        if isinstance(a, Dim):
            return a._guard(fn, *args)
    return fn(*args)
