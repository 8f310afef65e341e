"""2x2 max-pooling, stride 2: ``torch.max_pool2d(x, 2)``, several times faster where no gradient is taken.

ATen's CPU max-pooling scans each window element by element; evaluating the small convnets here it took as long
as their convolutions. A maximum is exact, so element-wise maxima of the four strided corners give the same
values (a zero's sign aside, where a window mixes 0.0 and -0.0: no later sum, loss or arg-max can tell them
apart). Odd heights and widths drop their last row or column, as ``max_pool2d``'s floor mode does. Where a
gradient may be taken, ATen's kernel stays: it routes each window's gradient to its first maximum, which the
corners' maxima would split between ties (common: a blank patch gives a constant activation). GPUs keep ATen's
kernel too. ``benchmarks/pooling.py`` times both.
"""

from __future__ import annotations

import torch


def max_pool2(x: torch.Tensor) -> torch.Tensor:
    """``torch.max_pool2d(x, 2)`` on a batch of images (``(..., H, W)``)."""
    if torch.is_grad_enabled() or x.is_cuda:
        return torch.max_pool2d(x, 2)
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    top = torch.maximum(x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2])
    return torch.maximum(top, torch.maximum(x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2]))
