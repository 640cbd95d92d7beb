"""torchvision's ResNets, built by hand in its layout (the same modules, names and forward passes as
``torchvision.models.resnet``): ``BasicBlock`` (ResNet-18/34), ``Bottleneck`` (ResNet-50), the
stem ``conv 7x7 stride 2 -> BatchNorm2d -> ReLU -> MaxPool2d(3, 2, 1)``, four stages, global
average pooling and a Linear head. ``width`` scales every stage's channels (64 is torchvision's);
``trained_statistics`` gives every BatchNorm running statistics and affine parameters as training
leaves them.

Example:
    >>> model = resnet18(num_classes=10, width=8).eval()
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn


def conv3x3(inplanes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)


def conv1x1(inplanes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + identity)``, the identity through ``downsample``
    (a strided 1x1 convolution and BatchNorm) where the shape changes."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(inplanes, planes, stride), nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.downsample, self.stride = downsample, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    """``relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + identity)``: 1x1, 3x3 (the
    stride), 1x1 to ``4 * planes`` channels."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None):
        super().__init__()
        self.conv1, self.bn1 = conv1x1(inplanes, planes), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = conv3x3(planes, planes, stride), nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample, self.stride = downsample, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ``ResNet(block, layers, num_classes)``, stages of ``width * (1, 2, 4, 8)``
    planes (``layers`` may list fewer than 4 stages: a reduced layout); ``(N, 3, H, W) -> (N,
    num_classes)``."""

    def __init__(self, block: type, layers: list[int], num_classes: int = 10, width: int = 64):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.stages = len(layers)
        for i, blocks in enumerate(layers):
            stage = self._make_layer(block, width * 2 ** i, blocks, stride=1 if i == 0 else 2)
            setattr(self, f"layer{i + 1}", stage)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 2 ** (len(layers) - 1) * block.expansion, num_classes)

    def _make_layer(self, block: type, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 10, width: int = 64) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, width)


def resnet34(num_classes: int = 10, width: int = 64) -> ResNet:
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes, width)


def resnet50(num_classes: int = 10, width: int = 64) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, width)


def trained_statistics(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` in eval mode, every BatchNorm with running statistics and affine parameters as
    training leaves them (drawn: variances in [0.3, 3], means in [-1, 1], gamma in [0.2, 1.5],
    beta in [-0.5, 0.5], per channel)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                draw = lambda lo, hi: lo + (hi - lo) * torch.rand(m.num_features, generator=gen)
                m.running_var.copy_(draw(0.3, 3))
                m.running_mean.copy_(draw(-1, 1))
                m.weight.copy_(draw(0.2, 1.5))
                m.bias.copy_(draw(-0.5, 0.5))
    return model.eval()
