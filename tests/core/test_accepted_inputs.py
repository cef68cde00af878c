"""Accepted inputs: unusual but legal layouts and values (non-contiguous, read-only,
broadcast, lists, int boxes, float16, K = 0, degenerate boxes) give defined results equal
to the plain contiguous call."""
from __future__ import annotations


import numpy as np
import pytest

import roicore.core as rc
from roicore.core.conventions import MAX_POOL, ROI_ALIGN
from opcalls import (
    N, C, H, W, PS, X, BOXES, FORWARD, BACKWARD, ALL_OPS, ALIGN_OPS, SAMPLING_OPS, crop,
    default_boxes, out_channels, position_sensitive, call, _argmax_for, _grad, run,
)


class TestAcceptedLayouts:
    @pytest.mark.parametrize("op", FORWARD)
    def test_non_contiguous_x(self, op):
        big = np.random.default_rng(7).standard_normal((N, C, H, 2 * W)).astype(np.float32)
        views = {
            "strided": big[:, :, :, ::2],
            "transposed": np.ascontiguousarray(big[:, :, :, :W].transpose(0, 1, 3, 2))
            .transpose(0, 1, 3, 2),
            "fortran": np.asfortranarray(big[:, :, :, :W]),
            "reversed-channels": big[:, ::-1, :, :W],
        }
        for name, v in views.items():
            assert not v.flags.c_contiguous, name
            ref = call(op, x=np.ascontiguousarray(v))
            got = call(op, x=v)
            assert got.dtype == ref.dtype and np.array_equal(got, ref), (op, name)

    def test_non_contiguous_x_argmax(self):
        big = np.random.default_rng(8).standard_normal((N, C, H, 2 * W)).astype(np.float32)
        v = big[:, :, :, 1::2]
        y0, a0 = rc.roi_pool(np.ascontiguousarray(v), BOXES, PS, return_argmax=True)
        y1, a1 = rc.roi_pool(v, BOXES, PS, return_argmax=True)
        assert np.array_equal(y0, y1) and np.array_equal(a0, a1)

    @pytest.mark.parametrize("op", BACKWARD)
    def test_non_contiguous_grad_and_boxes(self, op):
        g = _grad(op)
        g_nc = np.repeat(g, 2, axis=3)[:, :, :, ::2]
        boxes = default_boxes(op)
        boxes_nc = np.asfortranarray(boxes)
        assert not g_nc.flags.c_contiguous and np.array_equal(g_nc, g)
        ref = run(op, grad=g)
        got = run(op, grad=g_nc, boxes=boxes_nc)
        assert np.array_equal(got, ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_read_only_inputs(self, op):
        ref = run(op)
        x = X.copy()
        boxes = default_boxes(op).copy()
        kw = {"boxes": boxes}
        arrays = [x, boxes]
        if op in FORWARD:
            kw["x"] = x
        else:
            kw["grad"] = _grad(op)
            arrays.append(kw["grad"])
        if op == "roi_pool_backward_max":
            kw["argmax"] = _argmax_for().copy()
            arrays.append(kw["argmax"])
        for a in arrays:
            a.flags.writeable = False
        got = run(op, **kw)
        assert np.array_equal(got, ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_read_only_four_column_boxes_and_batch_indices(self, op):
        boxes = np.ascontiguousarray(default_boxes(op)[:, 1:])
        bi = np.array([0, 1])
        ref = run(op)
        boxes.flags.writeable = False
        bi.flags.writeable = False
        assert np.array_equal(run(op, boxes=boxes, batch_indices=bi), ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_broadcast_inputs(self, op):
        row = default_boxes(op)[1]
        boxes_b = np.broadcast_to(row, (3, 5))
        coords_b = np.broadcast_to(row[1:], (3, 4))
        bi_b = np.broadcast_to(np.int64(1), (3,))
        x_b = np.broadcast_to(X[1:], (N, C, H, W))
        assert not boxes_b.flags.writeable and not x_b.flags.writeable
        if op in FORWARD:
            kw = {"x": x_b}
        else:
            kw = {"grad": np.broadcast_to(_grad(op, 1), (3, out_channels(op), PS, PS))}
        kw_ref = {key: np.ascontiguousarray(v) for key, v in kw.items()}
        if op == "roi_pool_backward_max":
            a = np.broadcast_to(_argmax_for(np.ascontiguousarray(boxes_b))[:1], (3, C, PS, PS))
            kw["argmax"] = a
            kw_ref["argmax"] = np.ascontiguousarray(a)
        ref = run(op, boxes=np.ascontiguousarray(boxes_b), **kw_ref)
        assert np.array_equal(run(op, boxes=boxes_b, **kw), ref)
        assert np.array_equal(run(op, boxes=coords_b, batch_indices=bi_b, **kw), ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_python_lists(self, op):
        boxes = default_boxes(op)
        ref = run(op)
        assert np.array_equal(run(op, boxes=boxes.tolist()), ref)
        assert np.array_equal(run(op, boxes=boxes[:, 1:].tolist(), batch_indices=[0, 1]), ref)

    @pytest.mark.parametrize("op", [o for o in ALL_OPS if not crop(o)])
    @pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.int8])
    def test_int_boxes(self, op, dtype):
        boxes = np.array([[0, 1, 0, 5, 4], [1, 0, 2, 6, 5]], dtype)
        ref = run(op, boxes=boxes.astype(np.float32))
        got = run(op, boxes=boxes)
        assert got.dtype == np.float32 and np.array_equal(got, ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint32, np.uint64])
    def test_batch_indices_integer_dtypes(self, op, dtype):
        boxes = np.ascontiguousarray(default_boxes(op)[:, 1:])
        ref = run(op)
        assert np.array_equal(run(op, boxes=boxes, batch_indices=np.array([0, 1], dtype)), ref)

    @pytest.mark.parametrize("op", FORWARD)
    def test_float16_x(self, op):
        x16 = X.astype(np.float16)
        got = call(op, x=x16)
        ref = call(op, x=x16.astype(np.float32)).astype(np.float16)
        assert got.dtype == np.float16 and np.array_equal(got, ref)

    @pytest.mark.parametrize("op", BACKWARD)
    def test_float16_grad(self, op):
        g16 = _grad(op).astype(np.float16)
        got = run(op, grad=g16)
        ref = run(op, grad=g16.astype(np.float32)).astype(np.float16)
        assert got.dtype == np.float16 and got.shape == X.shape and np.array_equal(got, ref)

    @pytest.mark.parametrize("op", FORWARD)
    def test_float64_x(self, op):
        got = call(op, x=X.astype(np.float64))
        assert got.dtype == np.float64 and got.shape == (2, out_channels(op), PS, PS)
        want = call(op)
        if op == "roi_pool_nearest":
            # nearest picks a pixel by the sample's last bits: the first box's last row is
            # 0.9f * 5, exactly 4.5 in float32 (row 5) and 4.4999999 in float64 (row 4)
            assert not np.allclose(got[0, :, 1], want[0, :, 1])
            got, want = got[1:], want[1:]
        assert np.allclose(got, want, atol=1e-5)


class TestEmptyAndDegenerate:
    @pytest.mark.parametrize("op", FORWARD)
    @pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
    def test_no_boxes_forward(self, op, dtype):
        x = X.astype(dtype)
        for boxes, bi in [(np.zeros((0, 5), np.float32), None),
                          (np.zeros((0, 4)), np.zeros(0, np.int64)),
                          (np.zeros((0, 5), np.int32), None)]:
            out = call(op, x=x, boxes=boxes, batch_indices=bi, output_size=(3, 2)
                       if not position_sensitive(op) else PS)
            ph, pw = (3, 2) if not position_sensitive(op) else (PS, PS)
            assert out.shape == (0, out_channels(op), ph, pw) and out.dtype == dtype

    def test_no_boxes_argmax(self):
        for conv in MAX_POOL:
            y, a = rc.roi_pool(X, np.zeros((0, 5)), (3, 2), return_argmax=True, convention=conv)
            assert y.shape == a.shape == (0, C, 3, 2) and a.dtype.kind == "i"

    @pytest.mark.parametrize("op", FORWARD)
    def test_no_boxes_no_images(self, op):
        x = np.zeros((0, C, H, W), np.float32)
        out = call(op, x=x, boxes=np.zeros((0, 5)))
        assert out.shape == (0, out_channels(op), PS, PS)

    @pytest.mark.parametrize("op", BACKWARD)
    @pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
    def test_no_boxes_backward(self, op, dtype):
        g = np.zeros((0, out_channels(op), PS, PS), dtype)
        kw = {"argmax": np.zeros((0, C, PS, PS), np.int32)} if op.endswith("max") else {}
        dx = call(op, grad=g, boxes=np.zeros((0, 5)), **kw)
        assert dx.shape == X.shape and dx.dtype == dtype and not np.any(dx)
        dx = call(op, grad=g, boxes=np.zeros((0, 4)), batch_indices=np.zeros(0, int), **kw)
        assert dx.shape == X.shape and dx.dtype == dtype and not np.any(dx)

    DEGENERATE = {
        "larger": [0, -10, -20, 100, 200],
        "outside": [1, 50, 60, 70, 80],
        "outside-negative": [0, -80, -70, -60, -50],
        "reversed": [1, 5, 4, 1, 1],
        "zero-size": [0, 2, 3, 2, 3],
    }
    NDEGENERATE = {
        "larger": [0, -1, -2, 2, 3],
        "outside": [1, 3, 3, 4, 5],
        "outside-negative": [0, -4, -4, -3, -2],
        "reversed": [1, 0.9, 0.8, 0.1, 0.2],
        "zero-size": [0, 0.5, 0.5, 0.5, 0.5],
    }

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("kind", list(DEGENERATE))
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_degenerate_boxes_defined(self, op, kind, dtype):
        table = self.NDEGENERATE if crop(op) else self.DEGENERATE
        boxes = np.array([table[kind], default_boxes(op)[0]], np.float64)
        kw = {}
        if op in FORWARD:
            kw["x"] = X.astype(dtype)
        else:
            kw["grad"] = _grad(op).astype(dtype)
            if op.endswith("max"):
                kw["argmax"] = _argmax_for(boxes)
        extras = {op: [{}] for op in ALL_OPS}
        extras.update({op: [{}, {"aligned": True}, {"sampling_ratio": 2}] for op in ALIGN_OPS})
        extras.update({op: [{}, {"sampling_ratio": 2}] for op in SAMPLING_OPS if op not in ALIGN_OPS})
        for extra in extras[op]:
            out = run(op, boxes=boxes, **kw, **extra)
            expect = (2, out_channels(op), PS, PS) if op in FORWARD else X.shape
            assert out.shape == expect and out.dtype == dtype
            if op == "ps_roi_align" and kind == "zero-size" and not extra:
                # torchvision divides by the empty adaptive grid: 0/0
                assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
                continue
            assert np.all(np.isfinite(out)), (op, kind, extra)

    def test_max_pool_outside_box_is_zero_with_argmax_minus_one(self):
        for conv in MAX_POOL:
            y, a = rc.roi_pool(X, [self.DEGENERATE["outside"]], PS, return_argmax=True,
                               convention=conv)
            assert not np.any(y) and np.all(a == -1), conv

    @pytest.mark.parametrize("kind, pixel", [("reversed", (4, 5)), ("zero-size", (3, 2))])
    def test_max_pool_reversed_and_zero_boxes_are_one_pixel(self, kind, pixel):
        box = self.DEGENERATE[kind]
        y = rc.roi_pool(X, [box], PS)
        expect = X[box[0], :, pixel[0], pixel[1]]
        assert np.array_equal(y[0], np.broadcast_to(expect[:, None, None], (C, PS, PS)))

    def test_max_pool_box_larger_than_map_is_clamped(self):
        y = rc.roi_pool(X, [self.DEGENERATE["larger"]], 1)
        assert np.array_equal(y[0, :, 0, 0], X[0].max(axis=(1, 2)))

    def test_psroi_and_align_outside_box_is_zero(self):
        box = [self.DEGENERATE["outside"]]
        assert not np.any(rc.psroi_pool(X, box, PS))
        for conv in ROI_ALIGN:
            assert not np.any(rc.roi_align(X, box, PS, convention=conv)), conv

    @pytest.mark.parametrize("method", ["bilinear", "nearest"])
    def test_crop_outside_box_is_extrapolation_value(self, method):
        y = rc.roi_pool(X, [self.NDEGENERATE["outside"]], PS, method=method,
                        extrapolation_value=7.5)
        assert np.all(y == 7.5)

    @pytest.mark.parametrize("op", BACKWARD)
    def test_backward_of_outside_box_is_zero(self, op):
        table = self.NDEGENERATE if crop(op) else self.DEGENERATE
        boxes = np.array([table["outside"]], np.float32)
        kw = {"argmax": _argmax_for(boxes)} if op.endswith("max") else {}
        dx = run(op, boxes=boxes, grad=_grad(op, 1), **kw)
        assert dx.shape == X.shape and not np.any(dx)

    @pytest.mark.parametrize("op", SAMPLING_OPS)
    def test_enormous_box_with_fixed_sampling_ratio_is_fast(self, op):
        boxes = np.array([[0, 0, 0, 1e6, 1e6]], np.float32)
        kw = {"grad": _grad(op, 1)} if op in BACKWARD else {}
        out = call(op, boxes=boxes, sampling_ratio=2, **kw)
        assert np.all(np.isfinite(out))
