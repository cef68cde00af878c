"""A small detection head for the Paddle model tests: a strided convolution as backbone, one
RoI layer (from paddle.vision.ops or roicore.adapters.paddle: the module is an argument),
a linear classifier and a cross-entropy loss.  Weights and data come from seeded NumPy
generators, so every process (the data-parallel workers too) builds the same ones."""
import numpy as np
import paddle

OPS = ("roi_pool", "psroi_pool", "roi_align")
IMAGES, BOXES_PER_IMAGE, CLASSES = 2, 3, 3
POOLED = 2          # output_size
SCALE = 0.5         # the backbone's stride is 2


class Head(paddle.nn.Layer):
    def __init__(self, pool, channels, pooled_channels):
        super().__init__()
        self.backbone = paddle.nn.Conv2D(3, channels, 3, stride=2, padding=1)
        self.pool = pool
        self.fc = paddle.nn.Linear(pooled_channels * POOLED * POOLED, CLASSES)

    def forward(self, img, boxes, boxes_num):
        feat = paddle.nn.functional.relu(self.backbone(img))
        return self.fc(self.pool(feat, boxes, boxes_num).flatten(1))

    def loss(self, img, boxes, boxes_num, labels):
        return paddle.nn.functional.cross_entropy(self(img, boxes, boxes_num), labels)


def build_head(ops, op, seed):
    """Head on ``ops`` (paddle.vision.ops or roicore.adapters.paddle) with the RoI layer of
    ``op``, in the default dtype, weights drawn from ``seed``."""
    layer = {"roi_pool": ops.RoIPool, "psroi_pool": ops.PSRoIPool,
             "roi_align": ops.RoIAlign}[op](POOLED, SCALE)
    # psroi_pool: 3 output channels from 3 * 2 * 2 input channels
    model = Head(layer, 12, 3) if op == "psroi_pool" else Head(layer, 4, 4)
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.set_value(rng.standard_normal(p.shape).astype(p.numpy().dtype) * 0.3)
    return model


def head_batch(dtype, seed, image=None):
    """(img, boxes, boxes_num, labels) for both images, or for ``image`` alone (a
    data-parallel worker's shard)."""
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((IMAGES, 3, 16, 16)).astype(dtype)
    corner = rng.uniform(-2, 12, (IMAGES * BOXES_PER_IMAGE, 2))
    size = rng.uniform(1, 9, (IMAGES * BOXES_PER_IMAGE, 2))
    boxes = np.concatenate([corner, corner + size], 1).astype(dtype)
    labels = rng.integers(0, CLASSES, (IMAGES * BOXES_PER_IMAGE, 1))
    if image is not None:
        rows = slice(image * BOXES_PER_IMAGE, (image + 1) * BOXES_PER_IMAGE)
        img, boxes, labels = img[image:image + 1], boxes[rows], labels[rows]
    n_images = img.shape[0]
    return (paddle.to_tensor(img), paddle.to_tensor(boxes),
            paddle.to_tensor([BOXES_PER_IMAGE] * n_images, "int32"),
            paddle.to_tensor(labels, "int64"))
