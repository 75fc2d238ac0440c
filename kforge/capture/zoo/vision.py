"""ResNet-50 from torchvision: the published architecture with random weights."""

from __future__ import annotations

import torch

from kforge.capture.builders import Built, Resolved, building_on
from kforge.capture.zoo import ZooModel

IMAGE_SIDE = 224
TINY_IMAGE_SIDE = 64


def build_resnet50(entry: ZooModel, resolved: Resolved) -> Built:
    from torchvision.models.resnet import Bottleneck, ResNet, resnet50

    with building_on(resolved.device, resolved.dtype):
        if entry.tiny:  # the same Bottleneck blocks, one per stage and narrower
            model = ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=16)
        else:
            model = resnet50(weights=None)
    model.to(device=resolved.device, dtype=resolved.dtype).eval()
    side = TINY_IMAGE_SIDE if entry.tiny else IMAGE_SIDE
    images = torch.randn(resolved.batch, 3, side, side, device=resolved.device,
                         dtype=resolved.dtype)
    return Built(model, (images,), {})
