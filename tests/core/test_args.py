"""roicore.core.args, the public seam the adapters build on: its conversions of the
frameworks' box forms (the C API's, through the binding) and its normalisers."""
import numpy as np
import pytest

import roicore.core as rc
from roicore.core import args


def test_batch_from_counts():
    """Per-image box counts (Paddle's boxes_num, LoD lengths) to batch indices, every
    integer dtype; the messages name the argument as the caller does."""
    for counts, n_boxes, n_images, want in [
        ([2, 0, 1], 3, 3, [0, 0, 2]),
        (np.array([3], np.int32), 3, 1, [0, 0, 0]),
        (np.array([0, 0], np.uint8), 0, 2, []),
        (np.array([1, 2], np.uint64), 3, 2, [0, 1, 1]),
        (np.array([], np.int64), 0, 0, []),
    ]:
        got = args.batch_from_counts(counts, n_boxes, n_images)
        assert got.dtype == np.int64 and got.tolist() == want
    with pytest.raises(ValueError, match=r"lod must be non-negative, got lod\[1\] = -1") as caught:
        args.batch_from_counts(np.array([1, -1]), 0, 2, name="lod")
    assert (caught.value.argument, caught.value.index) == ("lod", 1)
    with pytest.raises(ValueError, match=r"boxes_num must sum to the number of boxes \(3\), got "
                                         r"sum\(boxes_num\) = 2"):
        args.batch_from_counts([1, 1], 3, 2)
    # counts whose sum leaves int64 are refused, not wrapped around
    with pytest.raises(ValueError, match=r"got sum\(boxes_num\) = more than 2\*\*63"):
        args.batch_from_counts(np.array([2**62, 2**62, 2**62], np.int64), 0, 3)
    with pytest.raises(ValueError, match=r"boxes_num holds 9223372036854775808, beyond int64"):
        args.batch_from_counts(np.array([2**63, 0], np.uint64), 0, 2)
    with pytest.raises(ValueError, match="one count per image"):
        args.batch_from_counts([1], 1, 2)
    with pytest.raises(TypeError, match="integer dtype"):
        args.batch_from_counts(np.array([1.0]), 1, 1)


def test_batch_from_indices():
    for dtype in (np.int8, np.uint16, np.int32, np.int64, np.uint64):
        got = args.batch_from_indices(np.array([1, 0, 1], dtype), 3, 2, name="box_indices")
        assert got.dtype == np.int64 and got.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match=r"box_indices\[2\] = 2 is out of range for a feature "
                                         r"map with N=2 images \(expected 0 <= index < 2\)"):
        args.batch_from_indices(np.array([1, 0, 2]), 3, 2, name="box_indices")
    assert args.batch_from_indices(np.array([1, -3]), 2, 2, masked=True).tolist() == [1, -1]
    with pytest.raises(ValueError, match=r"batch_indices must have shape \(3,\)"):
        args.batch_from_indices(np.array([1, 0]), 3, 2)


def test_boxes_from_yx():
    yx = np.array([[1, 2, 3, 4]], np.float64)
    got = args.boxes_from_yx(yx, np.float32)
    assert got.dtype == np.float32 and got.tolist() == [[2, 1, 4, 3]]
    assert args.boxes_from_yx(np.zeros((0, 4), np.float32), np.float64).shape == (0, 4)
    with pytest.raises(ValueError, match=r"boxes coordinates must be finite, got nan in box 0"):
        args.boxes_from_yx(np.array([[0, np.nan, 1, 1]]), np.float32)
    with pytest.raises(ValueError, match=r"boxes must have shape \(K, 4\) \[y1, x1, y2, x2\]"):
        args.boxes_from_yx(np.zeros((2, 5)), np.float32)


def test_normalisers():
    assert args.pair(3, "size") == (3, 3) and args.pair((2, np.int64(5)), "size") == (2, 5)
    for bad, exc in [((1, 2, 3), ValueError), (0, ValueError), (1.5, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="size"):
            args.pair(bad, "size")
    assert args.float32_scale(0.0625) == 0.0625
    with pytest.raises(ValueError, match=r"spatial_scale=1e-50 becomes 0.0 when held as a float32"):
        args.float32_scale(1e-50)
    assert args.ps_channels(2, None, 8, None) == (2, 2, 2, 2, 2)
    with pytest.raises(ValueError, match=r"images has C=7 channels, which is not a multiple"):
        args.ps_channels(2, None, 7, None, "images")


def test_public_names():
    """What the adapters take from roicore.core is public: in args' __all__ and documented."""
    for name in args.__all__:
        assert hasattr(args, name), name
    for name in ("pair", "boxes_and_batch", "batch_from_counts", "batch_from_indices",
                 "boxes_from_yx", "empty", "ALIGNMENT", "rules_codes"):
        assert name in args.__all__
    assert rc.args is args


@pytest.mark.parametrize("rules_type", ["MaxPoolRules", "BilinearPoolRules", "PSRoIPoolRules",
                                        "RoIAlignRules", "PSRoIAlignRules"])
def test_stored_rules_arrays_and_the_dataclasses_agree(rules_type):
    """A rules array stored by a native op (a saved graph) may stop before the fields with
    defaults; the C API then fills in the defaults, which must be the dataclass's own, and
    it knows as many fields as the dataclass has."""
    import dataclasses

    from roicore.core import _binding, conventions
    cls = getattr(conventions, rules_type)
    fields = dataclasses.fields(cls)
    known, required = _binding.RULES_FIELDS[rules_type]
    assert known == len(fields)
    assert required == sum(f.default is dataclasses.MISSING for f in fields)
    table = {"MaxPoolRules": conventions.MAX_POOL, "BilinearPoolRules": conventions.BILINEAR_POOL,
             "PSRoIPoolRules": conventions.PSROI_POOL, "RoIAlignRules": conventions.ROI_ALIGN,
             "PSRoIAlignRules": conventions.PSROI_ALIGN}[rules_type]
    for rules in table.values():
        codes = args.rules_codes(rules)
        assert _binding.rules_from_codes(rules_type, codes) == codes
        # the same rules with every defaulted field at its default, stored without them
        defaulted = dataclasses.replace(rules, **{f.name: f.default for f in fields[required:]})
        assert _binding.rules_from_codes(rules_type, codes[:required]) == \
            args.rules_codes(defaulted)
    with pytest.raises(ValueError, match="newer roicore"):
        _binding.rules_from_codes(rules_type, codes + (0,))
    if required > 1:
        with pytest.raises(ValueError, match=f"needs at least {required} fields"):
            _binding.rules_from_codes(rules_type, codes[:required - 1])
