"""The operator table: every operator of roicore.core, described once.

An :class:`Operator` names its forward and backward functions, the methods it computes
(RoI pooling: max, bilinear, nearest) with each method's conventions, the arguments it
takes beyond the shared ones (``x, boxes, output_size, spatial_scale``), and whether it
is position-sensitive.  :mod:`roicore.core.ops` registers each operator here as it defines
it; the command line (``roicore parity``, ``roicore bench``) and the tests read the table
instead of naming operators by hand, so a new operator is one entry.

A :class:`Variant` is an operator with one method, what the command line names and times
("roi_pool" is max pooling, "roi_pool_bilinear" the bilinear method).  Its
:meth:`Variant.forward` and :meth:`Variant.backward` call any operator the same way::

    from roicore.core import operators
    for v in operators.variants():
        y, saved = v.forward(x, boxes, 7, 1 / 16, saving=True, convention=v.method.default,
                             **v.options(sampling_ratio=2, aligned=True))
        dx = v.backward(dy, boxes, x.shape, 1 / 16, saved, convention=v.method.default,
                        **v.options(sampling_ratio=2, aligned=True))
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

__all__ = ["Method", "Operator", "Variant", "register", "operator", "variant", "variants",
           "OPERATORS"]


@dataclasses.dataclass(frozen=True)
class Method:
    """One way an operator computes, with its conventions (roicore.core.conventions)."""
    name: str                       # "max", "bilinear", "nearest"; "" for the only method
    conventions: Mapping[str, Any]  # convention name -> rules object
    default: str                    # the convention the function uses when given none
    saves_argmax: bool = False      # the backward takes the forward's argmax
    normalised_boxes: bool = False  # boxes in [0, 1] of the map (crop_and_resize), not pixels

    @property
    def rules_type(self) -> type:
        return type(next(iter(self.conventions.values())))


@dataclasses.dataclass(frozen=True)
class Operator:
    """An operator: its functions, methods (the first is the default) and options."""
    name: str
    forward: Callable
    backward: Callable
    methods: Tuple[Method, ...]
    # keyword arguments beyond x, boxes, output_size and spatial_scale that both functions
    # take (forward-only ones, such as output_channels, are not listed)
    options: Tuple[str, ...] = ()
    position_sensitive: bool = False  # x has D * PH * PW channels; the output has D
    boxes_backward: Optional[Callable] = None  # the gradient of the boxes, where defined

    def method(self, name: str = "") -> Method:
        for m in self.methods:
            if m.name == name or (not name and m is self.methods[0]):
                return m
        raise ValueError(f"{self.name} has no method {name!r}; it has "
                         f"{[m.name for m in self.methods]}")


@dataclasses.dataclass(frozen=True)
class Variant:
    """An operator computing with one of its methods."""
    operator: Operator
    method: Method

    @property
    def name(self) -> str:
        """The operator's name for its default method, else ``<operator>_<method>``."""
        default = self.method is self.operator.methods[0]
        return self.operator.name if default else f"{self.operator.name}_{self.method.name}"

    @property
    def conventions(self) -> Tuple[str, ...]:
        return tuple(self.method.conventions)

    def options(self, **values) -> Dict[str, Any]:
        """The given keyword arguments that this operator takes, of those any may take."""
        return {k: v for k, v in values.items() if k in self.operator.options}

    def _method_kw(self, kw):
        return {"method": self.method.name, **kw} if self.method.name else kw

    def forward(self, x, boxes, output_size, spatial_scale=1.0, *, saving=False, **kw):
        """``(y, saved)``: the output, and what :meth:`backward` needs of the forward (with
        ``saving``; the argmax of max pooling, else nothing)."""
        kw = self._method_kw(kw)
        if saving and self.method.saves_argmax:
            y, argmax = self.operator.forward(x, boxes, output_size, spatial_scale,
                                              return_argmax=True, **kw)
            return y, (argmax,)
        return self.operator.forward(x, boxes, output_size, spatial_scale, **kw), ()

    def backward(self, dy, boxes, input_shape, spatial_scale=1.0, saved=(), **kw):
        """The gradient of x for upstream gradient ``dy``; ``saved`` from :meth:`forward`."""
        kw = self._method_kw(kw)
        if self.method.saves_argmax:
            kw["argmax"] = saved[0]
        return self.operator.backward(dy, boxes, input_shape, spatial_scale, **kw)


OPERATORS: Dict[str, Operator] = {}


def register(op: Operator) -> Operator:
    """Add ``op`` to the table (roicore.core.ops does, for each of its operators)."""
    if op.name in OPERATORS:
        raise ValueError(f"operator {op.name!r} is already registered")
    OPERATORS[op.name] = op
    return op


def operator(name: str) -> Operator:
    try:
        return OPERATORS[name]
    except KeyError:
        raise ValueError(f"no operator {name!r}; choose from {', '.join(OPERATORS)}") from None


def variants() -> Tuple[Variant, ...]:
    """Every operator with each of its methods, in registration order."""
    return tuple(Variant(op, m) for op in OPERATORS.values() for m in op.methods)


def variant(name: str) -> Variant:
    """The variant called ``name`` ("roi_pool", "roi_pool_bilinear", ...)."""
    for v in variants():
        if v.name == name:
            return v
    raise ValueError(f"no operator {name!r}; choose from "
                     f"{', '.join(v.name for v in variants())}")
