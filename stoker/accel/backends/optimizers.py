"""Large-batch optimizers used in MLPerf submissions: LARS for ResNet-50, LAMB for BERT.

Both scale each layer's update by a trust ratio (the layer's weight norm over its update
norm), which keeps very large batches stable. As in the MLPerf references, one-dimensional
parameters (biases, BatchNorm/LayerNorm) are neither decayed nor adapted.
"""

from __future__ import annotations

import torch


def _trust(weight_norm: torch.Tensor, update_norm: torch.Tensor, scale: float) -> torch.Tensor:
    ok = (weight_norm > 0) & (update_norm > 0)
    return torch.where(ok, scale * weight_norm / update_norm.clamp(min=1e-12), torch.ones_like(weight_norm))


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise rate scaling (You, Gitman, Ginsburg 2017)."""

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 5e-5,
                 trust: float = 0.001) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, trust=trust))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if p.ndim > 1:
                    update = update.add(p, alpha=group["weight_decay"])
                    update = update * _trust(p.norm(), update.norm(), group["trust"])
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(update)
                p.add_(buf, alpha=-group["lr"])
        return loss


class LAMB(torch.optim.Optimizer):
    """Adam moments with a layer-wise trust ratio (You et al. 2019), as MLPerf BERT uses."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                m, v = state["m"], state["v"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = m / (1 - beta1 ** state["step"])
                v_hat = v / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if p.ndim > 1:
                    update = update.add(p, alpha=group["weight_decay"])
                    update = update * _trust(p.norm(), update.norm(), 1.0)
                p.add_(update, alpha=-group["lr"])
        return loss
