"""``roicore parity``'s model rows: torchvision's FPN detectors with the RoI heads' poolers
swapped for roicore's ``MultiScaleRoIAlign``, against the unchanged model, bit for bit.

One model with random weights runs with torchvision's poolers, then with roicore's: eval
outputs, then one training step's losses and every parameter's gradient, with the same
``torch.manual_seed`` before each forward so that the proposal samplers draw alike.  Torch
is imported only by :func:`run`, in the torch worker.
"""
from __future__ import annotations

import copy

import numpy as np

MODELS = ("fasterrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn")
# the detectors' image transform: images resized to this small size, so a pass is short
MIN_SIZE, MAX_SIZE = 160, 224
# detections kept per image in eval
DETECTIONS = 20
# fewer proposals than torchvision's defaults (1000 / 2000 after NMS, 512 sampled per image)
# to keep the passes short; still hundreds of boxes go through each pooler
PROPOSALS = dict(rpn_pre_nms_top_n_test=500, rpn_post_nms_top_n_test=250,
                 rpn_pre_nms_top_n_train=1000, rpn_post_nms_top_n_train=500,
                 box_batch_size_per_image=128)
# the RoI heads' poolers that are swapped (those a model has)
POOLERS = ("box_roi_pool", "mask_roi_pool")


def model_case(model, op):
    """A model row's data: two RGB images of different sizes in [0, 1] and their training
    targets (boxes inside the image, labels, and masks for Mask R-CNN)."""
    rng = np.random.default_rng([31, MODELS.index(model)])
    images, targets = [], []
    for h, w in ((150, 190), (176, 200)):
        images.append(rng.uniform(0, 1, (3, h, w)).astype(np.float32))
        k = 3
        xy = rng.uniform(0, 0.6, (k, 2)) * [w, h]
        wh = rng.uniform(0.15, 0.4, (k, 2)) * [w, h]
        boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
        masks = np.zeros((k, h, w), np.uint8)
        for i, (x1, y1, x2, y2) in enumerate(boxes.astype(int)):
            masks[i, y1:y2, x1:x2] = 1
        targets.append(dict(boxes=boxes, labels=rng.integers(1, 91, k).astype(np.int64),
                            masks=masks))
    return dict(name=model, group="model", op=op, model=model, images=images, targets=targets,
                seed=1234, dtype="float32")


def _comparison(a, b, compare):
    """Elements, mismatching elements, max abs diff and the mismatching names of two dicts
    of arrays with the same keys (a key on one side only is a mismatch of its size)."""
    n = m = 0
    d = 0.0
    bad = []
    for key in list(a) + [k for k in b if k not in a]:
        if key not in a or key not in b:
            size = np.size(a.get(key, b.get(key)))
            n, m, d = n + size, m + max(size, 1), float("inf")
            bad.append(key)
            continue
        kn, km, kd = compare(np.ravel(a[key]), np.ravel(b[key]))
        n, m, d = n + kn, m + km, max(d, kd)
        if km:
            bad.append(key)
    return dict(elements=n, mismatches=m, max_abs_diff=d, mismatching=bad[:8])


def run(case, adapter, perturb=False, n_threads=None):
    """Both runs of a model case and their comparison: a dict with ``eval``, ``losses`` and
    ``gradients`` (each elements / mismatches / max_abs_diff / mismatching names), the
    number of detections and of roicore pooler calls, and each side's error (or None).
    ``perturb`` puts roicore's poolers 2**-20 off (the parity fault hook)."""
    import torch
    import torchvision
    from .cases import compare

    torch.manual_seed(case["seed"])
    build = getattr(torchvision.models.detection, case["model"])
    # random weights score low: keep every detection, but only the DETECTIONS best per image
    # (Mask R-CNN's eval pastes a mask for each)
    model = build(weights=None, weights_backbone=None, min_size=MIN_SIZE, max_size=MAX_SIZE,
                  box_score_thresh=0.0, box_detections_per_img=DETECTIONS, **PROPOSALS)
    state = copy.deepcopy(model.state_dict())
    native_poolers = {p: getattr(model.roi_heads, p) for p in POOLERS
                      if getattr(model.roi_heads, p, None) is not None}
    images = [torch.from_numpy(a) for a in case["images"]]
    targets = [{k: torch.from_numpy(v) for k, v in t.items()
                if k != "masks" or "mask" in case["model"]} for t in case["targets"]]
    calls = [0]

    def counted(module, inputs, output):
        calls[0] += 1
        return output * (1 + 2 ** -20) if perturb else output

    def side(which):
        model.load_state_dict(state)
        for name, pooler in native_poolers.items():
            if which == "roicore":
                pooler = adapter.MultiScaleRoIAlign(
                    pooler.featmap_names, pooler.output_size, pooler.sampling_ratio,
                    canonical_scale=pooler.canonical_scale,
                    canonical_level=pooler.canonical_level, n_threads=n_threads)
                pooler.register_forward_hook(counted)
            setattr(model.roi_heads, name, pooler)
        out = dict(eval={}, losses={}, gradients={})
        model.eval()
        torch.manual_seed(case["seed"])
        with torch.no_grad():
            detections = model(images)
        for i, det in enumerate(detections):
            for key, v in det.items():
                out["eval"][f"image{i}.{key}"] = v.numpy()
        model.train()
        model.zero_grad(set_to_none=True)
        torch.manual_seed(case["seed"])
        losses = model(images, targets)
        sum(losses.values()).backward()
        out["losses"] = {k: v.detach().numpy() for k, v in losses.items()}
        # copies: the other side's run must not reach these through the parameters' .grad
        out["gradients"] = {k: p.grad.numpy().copy() for k, p in model.named_parameters()
                            if p.grad is not None}
        return out

    runs, errors = {}, {}
    for which in ("native", "roicore"):
        try:
            runs[which] = side(which)
            errors[which] = None
        except Exception as e:  # noqa: BLE001
            from ._proc import error_text
            runs[which], errors[which] = None, error_text(e)
    rec = dict(native_error=errors["native"], roicore_error=errors["roicore"],
               roicore_calls=calls[0], detections=None)
    if runs["native"] is not None and runs["roicore"] is not None:
        for part in ("eval", "losses", "gradients"):
            rec[part] = _comparison(runs["roicore"][part], runs["native"][part], compare)
        rec["detections"] = sum(int(np.shape(v)[0]) for k, v in runs["native"]["eval"].items()
                                if k.endswith(".scores"))
    return rec
