"""The compiled core behind the reference's function signatures.

tests/core/test_worked_examples.py runs every worked example twice, once on tests/reference.py
and once on this module, so the documents' numbers pin both implementations.  Helpers
that only the reference has (c_round, caffe_bin_edges, numeric_grad) are passed through.
"""
import dataclasses

import numpy as np

import roicore.core as rc
from reference import FLT_MAX, c_round, caffe_bin_edges, numeric_grad  # noqa: F401
from roicore.core import conventions as cv

_RULE_TYPES = {cls.__name__: cls for cls in (cv.MaxPoolRules, cv.BilinearPoolRules,
                                             cv.PSRoIPoolRules, cv.RoIAlignRules,
                                             cv.PSRoIAlignRules)}


def _rules(rules):
    """The tests load conventions.py by path; rebuild the object as roicore's own class."""
    return _RULE_TYPES[type(rules).__name__](**dataclasses.asdict(rules))


def _boxes(boxes, like):
    return np.asarray(boxes, dtype=np.asarray(like).dtype)


def roi_pool_max(x, boxes, batch, output_size, spatial_scale, rules):
    return rc.roi_pool(x, _boxes(boxes, x), output_size, spatial_scale, batch_indices=np.asarray(batch),
                       convention=_rules(rules), return_argmax=True)


def roi_pool_max_backward(grad_output, argmax, batch, input_shape, rules):
    K = np.shape(grad_output)[0]
    return rc.roi_pool_backward(grad_output, np.zeros((K, 4)), input_shape,
                                batch_indices=np.asarray(batch), convention=_rules(rules),
                                argmax=argmax)


def roi_pool_bilinear(x, boxes, batch, output_size, rules, extrapolation_value=0.0):
    return rc.roi_pool(x, _boxes(boxes, x), output_size, batch_indices=np.asarray(batch),
                       method="bilinear", convention=_rules(rules),
                       extrapolation_value=extrapolation_value)


def roi_pool_bilinear_backward(grad_output, boxes, batch, input_shape, rules,
                               extrapolation_value=0.0):
    return rc.roi_pool_backward(grad_output, _boxes(boxes, grad_output), input_shape,
                                batch_indices=np.asarray(batch), method="bilinear",
                                convention=_rules(rules))


def psroi_pool(x, boxes, batch, output_channels, output_size, spatial_scale, rules, group_size=None):
    return rc.psroi_pool(x, _boxes(boxes, x), output_size, spatial_scale,
                         output_channels=output_channels, group_size=group_size,
                         batch_indices=np.asarray(batch), convention=_rules(rules))


def psroi_pool_backward(grad_output, boxes, batch, input_shape, output_size, spatial_scale, rules,
                        group_size=None):
    assert tuple(np.shape(grad_output)[2:]) == tuple(np.broadcast_to(output_size, 2))
    return rc.psroi_pool_backward(grad_output, _boxes(boxes, grad_output), input_shape,
                                  spatial_scale, group_size=group_size,
                                  batch_indices=np.asarray(batch), convention=_rules(rules))


def roi_align(x, boxes, batch, output_size, spatial_scale, sampling_ratio, aligned, rules):
    return rc.roi_align(x, _boxes(boxes, x), output_size, spatial_scale, sampling_ratio, aligned,
                        batch_indices=np.asarray(batch), convention=_rules(rules))


def roi_align_backward(grad_output, boxes, batch, input_shape, output_size, spatial_scale,
                       sampling_ratio, aligned, rules):
    assert tuple(np.shape(grad_output)[2:]) == tuple(np.broadcast_to(output_size, 2))
    return rc.roi_align_backward(grad_output, _boxes(boxes, grad_output), input_shape,
                                 spatial_scale, sampling_ratio, aligned,
                                 batch_indices=np.asarray(batch), convention=_rules(rules))


def ps_roi_align(x, boxes, batch, output_size, spatial_scale, sampling_ratio, rules):
    return rc.ps_roi_align(x, _boxes(boxes, x), output_size, spatial_scale, sampling_ratio,
                           batch_indices=np.asarray(batch), convention=_rules(rules))


def ps_roi_align_backward(grad_output, boxes, batch, input_shape, output_size, spatial_scale,
                          sampling_ratio, rules):
    assert tuple(np.shape(grad_output)[2:]) == tuple(np.broadcast_to(output_size, 2))
    return rc.ps_roi_align_backward(grad_output, _boxes(boxes, grad_output), input_shape,
                                    spatial_scale, sampling_ratio,
                                    batch_indices=np.asarray(batch), convention=_rules(rules))
