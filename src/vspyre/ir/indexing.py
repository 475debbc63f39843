"""Index expressions: sympy expressions over iteration variables, sizes and (indirect) SSA values.

A Load/Store addresses its buffer with an *element offset from the buffer's first element* (the
tensor's data pointer, as Inductor indexes its kernel arguments). The expression may use:

* iteration variables (``x0``, ``r0``, ... : the program's dims),
* size symbols (``s0``, ...), bound at launch,
* SSA value names (indirect indexing, e.g. an embedding row loaded from another buffer),
* ``FloorDiv``/``ModularIndexing`` (torch.utils._sympy.functions, what Inductor emits for views),
  ``Mod``, ``Min``, ``Max`` and integer powers.

Two things are derived from an expression: its *affine form* (constant + sum of integer
coefficient x variable), used by the fast path (a strided view instead of a gather) and by the
latency model (is the access stick-contiguous?); and a *torch evaluator* (a compiled Python
function over broadcast ``arange`` tensors), used when the expression is not affine.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Mapping

import sympy
import torch

from torch.utils._sympy.functions import (  # not inductor: torch's sympy helpers
    CeilDiv, CleanDiv, FloorDiv, ModularIndexing, PythonMod, Where)

__all__ = ["sym", "to_expr", "affine_form", "compile_expr", "free_names", "FloorDiv", "ModularIndexing"]


@functools.lru_cache(maxsize=None)
def sym(name: str) -> sympy.Symbol:
    """The canonical symbol for an iteration variable, size or SSA value (integer, >= 0)."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


_LOCALS = {"FloorDiv": FloorDiv, "ModularIndexing": ModularIndexing, "Min": sympy.Min, "Max": sympy.Max,
           "Mod": sympy.Mod, "Abs": sympy.Abs, "PythonMod": PythonMod, "CleanDiv": CleanDiv, "CeilDiv": CeilDiv,
           "Where": Where, "Eq": sympy.Eq, "Ne": sympy.Ne, "Lt": sympy.Lt, "Le": sympy.Le, "Gt": sympy.Gt,
           "Ge": sympy.Ge}


def to_expr(value: Any) -> sympy.Expr:
    """Accept an int, a sympy expression or a string (``"1024*x0 + r0"``) and return a sympy expr.

    Every free symbol is replaced by the canonical integer symbol of the same name, so that
    expressions written by different compilers compare and hash equal.
    """
    if isinstance(value, bool):
        raise TypeError("index expression: bool is not an index")
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, str):
        names = {}
        value = re.sub(r"%([A-Za-z_0-9]+)", r"__ssa_\1", value)   # SSA values (indirect indexing)
        for n in set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", value)):
            if n not in _LOCALS:
                names[n] = sym("%" + n[6:] if n.startswith("__ssa_") else n)
        value = sympy.sympify(value, locals={**_LOCALS, **names})
    if not isinstance(value, sympy.Basic):
        raise TypeError(f"index expression: cannot use {value!r} ({type(value).__name__})")
    repl = {s: sym(s.name) for s in value.free_symbols if s is not sym(s.name)}
    return value.xreplace(repl) if repl else value


def free_names(expr: sympy.Expr) -> frozenset[str]:
    return frozenset(s.name for s in expr.free_symbols)


def affine_form(expr: sympy.Expr, variables: tuple[str, ...]) -> tuple[int, dict[str, int]] | None:
    """``(constant, {var: coefficient})`` if ``expr`` is affine with integer coefficients in
    ``variables`` and has no other free symbol; else ``None``. Sizes must already be substituted."""
    if expr.free_symbols - {sym(v) for v in variables}:
        return None
    expr = sympy.expand(expr)
    const = 0
    coefs: dict[str, int] = {}
    for term in sympy.Add.make_args(expr):
        if term.is_Integer:
            const += int(term)
            continue
        c, rest = term.as_coeff_Mul()
        if not c.is_Integer or not rest.is_Symbol or rest.name not in variables:
            return None
        coefs[rest.name] = coefs.get(rest.name, 0) + int(c)
    return const, {k: v for k, v in coefs.items() if v != 0}


def _emit(e: sympy.Basic) -> str:
    if e.is_Integer:
        return f"({int(e)})"
    if e.is_Symbol:
        return f"E[{e.name!r}]"
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(_emit(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(_emit(a) for a in e.args) + ")"
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        return f"({_emit(e.base)} ** {int(e.exp)})"
    if isinstance(e, FloorDiv):
        return f"({_emit(e.args[0])} // {_emit(e.args[1])})"
    if isinstance(e, ModularIndexing):
        x, d, m = e.args
        return f"(({_emit(x)} // {_emit(d)}) % {_emit(m)})"
    if isinstance(e, (sympy.Mod, PythonMod)):
        return f"({_emit(e.args[0])} % {_emit(e.args[1])})"
    if isinstance(e, CleanDiv):
        return f"({_emit(e.args[0])} // {_emit(e.args[1])})"
    if isinstance(e, CeilDiv):
        return f"(-((-{_emit(e.args[0])}) // {_emit(e.args[1])}))"
    if isinstance(e, sympy.Abs):
        return f"_abs({_emit(e.args[0])})"
    if isinstance(e, Where):
        return f"_where({_emit(e.args[0])}, {_emit(e.args[1])}, {_emit(e.args[2])})"
    if isinstance(e, sympy.core.relational.Relational):
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[e.rel_op]
        return f"({_emit(e.lhs)} {op} {_emit(e.rhs)})"
    if e is sympy.true or e is sympy.false:
        return "True" if e is sympy.true else "False"
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        # floor/ceiling of a rational expression, as sympy writes FloorDiv sometimes (a * b**-1)
        # or Inductor's index math leaves it (adaptive pooling: floor(8*M/5 + 12/5)): exactly, in
        # integer arithmetic, as (num // den) over one common denominator.
        num, den = _integer_fraction(e.args[0], e)
        if isinstance(e, sympy.floor):
            return f"({_emit(num)} // {_emit(den)})"
        return f"(-((-{_emit(num)}) // {_emit(den)}))"
    if isinstance(e, sympy.Min):
        out = _emit(e.args[0])
        for a in e.args[1:]:
            out = f"_min({out}, {_emit(a)})"
        return out
    if isinstance(e, sympy.Max):
        out = _emit(e.args[0])
        for a in e.args[1:]:
            out = f"_max({out}, {_emit(a)})"
        return out
    raise NotImplementedError(f"index expression: unsupported term {e!r} ({type(e).__name__})")


def _integer_fraction(arg: sympy.Expr, term: sympy.Basic) -> tuple[sympy.Expr, sympy.Expr]:
    """``arg`` as ``num / den`` with integer-valued ``num`` and a positive integer-valued ``den``."""
    num, den = sympy.together(arg).as_numer_denom()
    if den.is_negative:
        num, den = -num, -den
    if not (num.is_integer and den.is_integer and den.is_nonnegative):
        raise NotImplementedError(f"index expression: unsupported term {term!r} (not a fraction of integers)")
    return num, den


def _abs(a):
    return a.abs() if isinstance(a, torch.Tensor) else abs(a)


def _where(c, a, b):
    if isinstance(c, torch.Tensor):
        return torch.where(c, torch.as_tensor(a), torch.as_tensor(b))
    return a if c else b


def _min(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))
    return min(a, b)


def _max(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))
    return max(a, b)


@functools.lru_cache(maxsize=4096)
def compile_expr(expr: sympy.Expr) -> Callable[[Mapping[str, Any]], Any]:
    """A Python function ``f(E)`` evaluating ``expr`` with ``E[name]`` = int or int64 tensor.

    Integer tensors broadcast, so passing ``arange``s shaped along their own axis gives the
    index of every point of a box in one call.
    """
    src = _emit(expr)
    code = compile(f"lambda E: {src}", f"<index {expr}>", "eval")
    return eval(code, {"_min": _min, "_max": _max, "_abs": _abs, "_where": _where})  # noqa: S307 - generated from a sympy tree
