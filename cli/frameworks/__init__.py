"""The frameworks the CLI runs: one harness per framework, behind one interface.

A harness turns a case (framework-neutral NumPy data, described in ``roicore.cli.cases``)
into the framework's own tensors, binds the framework's native operator and roicore's
counterpart to them (the adapter, or roicore.core under the framework's convention where
roicore has no adapter), and runs a bound call forward, or forward and backward through the
framework's autograd.  ``roicore parity`` and ``roicore bench`` drive every harness the same
way, in a worker process of its own (``_parity_worker``, ``_bench_worker``).

A harness imports its framework in its constructor, so importing this package, or any of
its modules, imports no framework.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import numpy as np

F32, F64 = "float32", "float64"

# The frameworks with a harness (each a module of this package).
NAMES = ("paddle", "mxnet", "tensorflow", "openvino", "onnxruntime", "torch")


def missing_module(exc, name):
    """The module of framework ``name`` that ``exc`` (an ImportError, or one it was raised
    from) says is not installed, or None when the import failed for another reason."""
    if name not in NAMES:   # roicore itself: never a missing framework
        return None
    requires = harness_class(name).requires
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in requires:
            return exc.name.split(".")[0]
        exc = exc.__cause__ or exc.__context__
    return None


def harness_class(name):
    """The Harness class of framework ``name`` (its module imports no framework)."""
    if name not in NAMES:
        raise ValueError(f"no harness for {name!r}; choose from {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}").Harness


class Unsupported(Exception):
    """The framework has no such operator, or not for these arguments: no contender, not a
    failure."""


@dataclasses.dataclass
class Call:
    """An operator bound to its inputs.

    ``fn(x)`` computes the output from ``x``, the input a gradient is taken for (a harness
    may pass a fresh copy of it); ``dy`` is the upstream gradient in the output's layout;
    ``layout`` is the data layout of ``x`` and of the output ("NCHW" or "NHWC").
    """
    fn: Callable[[Any], Any]
    x: Any
    dy: Any = None
    layout: str = "NCHW"


class Harness:
    """One framework: its tensors, its native RoI operators and roicore's counterpart.

    Operators are named as in ``cases.OPS``.  A method that cannot serve an operator raises
    :class:`Unsupported`.
    """
    name = ""
    # operator -> the dtypes in which roicore's counterpart claims to equal the native op bit
    # for bit (what ``roicore parity`` compares)
    parity_claims: dict = {}
    # operator -> the roicore.core convention that computes the native op's bits, where
    # roicore has no adapter for the framework: :meth:`roicore` runs roicore.core under it
    conventions: dict = {}
    # whether the native operator has a gradient (parity compares it, bench times fwd+bwd)
    differentiable = True
    # whether roicore has an adapter for this framework (bench times it against roicore.core
    # in the same process, and the framework's autograd cost around it)
    has_adapter = True
    # the data layouts the adapter takes (the bench times it in the first)
    layouts = ("NCHW",)
    # what the reports call the native operators and, in parity, what they are compared with
    native_text = ""
    parity_text = ""
    # the modes :meth:`train` runs its head in (parity's training rows; none: no head)
    training_modes = ()
    # the modules whose absence means the framework is not installed (a failure to import
    # anything else is a broken installation), and the command that installs them
    requires: tuple = ()
    install = ""

    def __init__(self, threads=None):
        """Import the framework; ``threads`` None leaves its thread count at its default."""
        self.threads = threads
        self.version = ""

    def restrict(self, case):
        """``(case, note)``: the case without the boxes the native op cannot take (it would
        crash or abort), and a note saying how many were left out and why (None: none)."""
        return case, None

    def inputs(self, case, dtype, dy):
        """The framework's tensors for ``case`` in ``dtype``, and the upstream gradient ``dy``
        (NumPy, NCHW, the output's shape); what :meth:`native` and :meth:`roicore` bind."""
        raise NotImplementedError

    def native(self, case, inputs):
        """A :class:`Call` of the framework's own operator for ``case``."""
        raise Unsupported(f"{self.name} has no native {case['op']}")

    def roicore(self, case, inputs, layout="NCHW"):
        """A :class:`Call` of roicore's counterpart of :meth:`native` (the adapter), taking
        and returning tensors in ``layout``, one of :attr:`layouts`.

        Here: roicore.core's forward under the operator's convention in :attr:`conventions`,
        on the NumPy ``x`` and ``rois`` of :meth:`inputs` (a harness without an adapter)."""
        convention = self.conventions.get(case["op"])
        if convention is None:
            raise Unsupported(f"roicore has no {self.name} counterpart of {case['op']}")
        from roicore.core import operators
        v = operators.variant(case["op"])
        options = v.options(sampling_ratio=case["sampling_ratio"], aligned=case["aligned"])
        rois, size, s = inputs["rois"], case["output_size"], case["spatial_scale"]
        return Call(lambda x: v.forward(x, rois, size, s, convention=convention, **options)[0],
                    inputs["x"])

    def train(self, call, case, dtype, mode):
        """Train the head of a training case (``cases.training_case``) with ``call``'s
        operator as its RoI layer, in ``mode`` (one of :attr:`training_modes`):
        ``case["steps"]`` plain SGD steps of the convolution's weight on
        mean((call.fn(conv(images)) - target)**2), the convolution 3x3 with padding 1 and no
        bias, in the framework's own operators and autograd.  Returns ``[(loss, weight)]``
        after each step as NumPy, the weight as (C, 3, 3, 3).  ``call`` comes from
        :meth:`native` or :meth:`roicore` on the case's :meth:`inputs`; its x is unused."""
        raise Unsupported(f"no training head for {self.name}")

    def model(self, case, perturb=False):
        """A model case (``cases.model_cases``): the detector run with the native poolers
        and with roicore's, compared in the worker (``_pyramid_parity_models.run``);
        ``perturb`` puts roicore's side slightly off (parity's fault hook)."""
        raise Unsupported(f"no model rows for {self.name}")

    def forward(self, call):
        """The output of ``call``, computed (not merely scheduled)."""
        return call.fn(call.x)

    def forward_backward(self, call):
        """``(y, dx)``: the forward recorded for autograd and the gradient of ``call.x`` for
        the upstream gradient ``call.dy``, both computed."""
        raise Unsupported(f"{self.name}'s native operators have no gradient")

    def null(self, call, inputs):
        """A :class:`Call` of an operator that does nothing, of ``call``'s shapes: its forward
        returns a ready tensor of the output's shape and its backward a ready one of the
        input's, recorded and differentiated as the adapter is.  Its time is what the
        framework's autograd costs around any operator of these shapes."""
        raise Unsupported(f"{self.name} has no adapter")

    def to_numpy(self, t, layout="NCHW"):
        """A framework tensor as a NumPy array in NCHW (None stays None)."""
        if t is None:
            return None
        a = np.asarray(t)
        return a.transpose(0, 3, 1, 2) if layout == "NHWC" else a

    def core_rules(self):
        """The conventions the adapter gives roicore.core (name or rules object) for each of
        "roi_pool", "roi_pool/saving" (forward keeping the argmax), "roi_pool/backward",
        "roi_align", "psroi_pool" and, where the adapter has it, "ps_roi_align"."""
        raise Unsupported(f"{self.name} has no adapter")


# ----------------------------------------------------------------------------- helpers
def boxes_and_batch(case, dtype):
    """``(boxes (K, 4), batch (K,) int32)`` of a case's ``rois`` rows [batch, x1, y1, x2, y2]."""
    rois = case["rois"]
    return np.ascontiguousarray(rois[:, 1:], dtype), rois[:, 0].astype(np.int32)


def arrays(case, dtype):
    """NumPy inputs for a runtime that takes arrays: ``x``, ``rois`` (K, 5), ``boxes`` (K, 4)
    and ``batch`` (K,) int32, in ``dtype``."""
    boxes, batch = boxes_and_batch(case, dtype)
    return dict(x=np.ascontiguousarray(case["x"], dtype),
                rois=np.ascontiguousarray(case["rois"], dtype), boxes=boxes, batch=batch)


def float32_arrays(case, dtype, framework):
    """:func:`arrays` for a runtime that is run in float32 only."""
    if dtype != F32:
        raise Unsupported(f"{framework} is run in float32 only, not {dtype}")
    return arrays(case, np.float32)


def conventions_text(conventions):
    """What parity compares a harness's native ops with: its :attr:`Harness.conventions`."""
    ops = {}
    for op, convention in conventions.items():
        ops.setdefault(convention, []).append(op)
    return "roicore.core convention " + ", ".join(
        f"{c!r} ({', '.join(o)})" for c, o in ops.items())


def boxes_per_image(case):
    """Per-image box counts (Paddle's boxes_num), int32; a case's boxes are grouped by image."""
    return np.bincount(case["rois"][:, 0].astype(np.int64),
                       minlength=case["x"].shape[0]).astype(np.int32)


def output_channels(case):
    """Channels of the operator's output: C, or C / (PH * PW) for the position-sensitive
    operators.  A pyramid case's ``x`` is a list of maps of the same channels."""
    from ..cases import POSITION_SENSITIVE
    PH, PW = case["output_size"]
    C = (case["x"][0] if isinstance(case["x"], list) else case["x"]).shape[1]
    return C // (PH * PW) if case["op"] in POSITION_SENSITIVE else C


def keep_boxes(case, keep, why):
    """``(case, note)`` with only the boxes where ``keep`` holds (see Harness.restrict)."""
    dropped = int(np.count_nonzero(~keep))
    if not dropped:
        return case, None
    case = dict(case, rois=case["rois"][keep])
    if "dy" in case:
        case["dy"] = case["dy"][keep]
    return case, f"{dropped} box(es) not sent to the native op: {why}"
