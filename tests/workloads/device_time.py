"""A stand-in for device kernels shared by the workloads: an autograd identity whose forward and
backward take a set time. On a GPU the host waits for a slow device the same way, so each rank's
compute time is known and the 2-core test machine's contention does not blur it."""

from __future__ import annotations

import time

import torch


class DeviceTime(torch.autograd.Function):
    """Identity whose forward and backward take fwd_s and bwd_s seconds."""

    @staticmethod
    def forward(ctx, x, fwd_s: float, bwd_s: float):
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd_s)
        return grad, None, None
