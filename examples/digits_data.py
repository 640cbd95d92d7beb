"""Data loading shared by the examples (not an example itself): scikit-learn's digits (8x8
images, 10 classes) as the examples use them: standardised pixels, zero-mean one-hot targets, a
random train/test split.

Example:
    >>> from digits_data import load
    >>> x, y, labels, train, test = load(1000, 797)
    >>> x.shape, y.shape
    (torch.Size([1797, 64]), torch.Size([1797, 10]))
"""

import torch
from sklearn.datasets import load_digits
from torch import nn


def load(n_train: int, n_test: int) -> tuple[torch.Tensor, ...]:
    """``(x (1797, 64) float64, y (1797, 10), labels (1797,), train, test)``: ``train`` and
    ``test`` are disjoint random indices (``n_train`` and ``n_test`` of them), drawn after
    ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float64)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)  # standardise each pixel
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(x))
    y = nn.functional.one_hot(labels, 10).double() - 0.1  # zero-mean one-hot targets
    return x, y, labels, order[:n_train], order[n_train:n_train + n_test]
