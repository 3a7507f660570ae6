"""FLOP counting shared by the tracer and its tests.

:func:`flop_counter` is ``torch.utils.flop_counter.FlopCounterMode`` with the
formulas torch lacks: on CPU, ``scaled_dot_product_attention`` runs the
``_scaled_dot_product_flash_attention_for_cpu`` kernels, which the stock
counter prices at zero, so a model would look cheaper on the CPU than on the
meta device or a GPU. Registering them here (not globally) keeps the counts
of one model the same wherever it is traced.

>>> import torch
>>> with flop_counter() as counter:
...     _ = torch.ones(4, 8) @ torch.ones(8, 2)
>>> counter.get_total_flops()
128
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import flop_counter as _fc

__all__ = ["EXTRA_FORMULAS", "FusedAttentionOnMeta", "flop_counter", "model_flops"]

_aten = torch.ops.aten


def _extra_formulas() -> dict:
    formulas: dict = {}
    forward = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    # torch's module-level formulas already take tensors (shape_wrapper applied).
    if forward is not None and hasattr(_fc, "sdpa_flop"):
        formulas[forward] = _raw(_fc.sdpa_flop)
    if backward is not None and hasattr(_fc, "sdpa_backward_flop"):
        formulas[backward] = _raw(_fc.sdpa_backward_flop)
    return formulas


def _raw(formula):
    def raw(*args, **kwargs):
        return formula(*args, **kwargs)
    raw._get_raw = True
    return raw


EXTRA_FORMULAS = _extra_formulas()


def flop_counter() -> _fc.FlopCounterMode:
    """A silent ``FlopCounterMode`` that also prices the CPU attention kernels."""
    return _fc.FlopCounterMode(display=False, custom_mapping=dict(EXTRA_FORMULAS))


class FusedAttentionOnMeta(torch.overrides.TorchFunctionMode):
    """Runs ``scaled_dot_product_attention`` on meta tensors as the fused kernel.

    On the meta device torch picks the unfused "math" attention, whose backward
    skips the recomputation of the scores that the fused kernels (CPU and GPU)
    do, so meta tensors would count fewer backward FLOPs than real ones.

    >>> q = torch.empty(1, 2, 4, 8, device="meta", requires_grad=True)
    >>> with FusedAttentionOnMeta(), flop_counter() as counter:
    ...     torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
    >>> counter.get_total_flops()
    3584
    """

    _fused = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SDPA and self._fused is not None:
            call = _sdpa_arguments(*args, **kwargs)
            q, k, v = call["query"], call["key"], call["value"]
            mask = call["attn_mask"]
            if (all(isinstance(t, torch.Tensor) and t.is_meta and t.dim() == 4
                    for t in (q, k, v))
                    and not call["enable_gqa"] and q.shape[1] == k.shape[1] == v.shape[1]
                    and (mask is None or isinstance(mask, torch.Tensor))):
                if mask is not None and mask.dtype == torch.bool:
                    # What sdpa itself does before calling a fused kernel.
                    mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
                return self._fused(q, k, v, call["dropout_p"], call["is_causal"],
                                   attn_mask=mask, scale=call["scale"])[0]
        return func(*args, **kwargs)


_SDPA = {torch.nn.functional.scaled_dot_product_attention,
         _aten.scaled_dot_product_attention.default}


def _sdpa_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    return {"query": query, "key": key, "value": value, "attn_mask": attn_mask,
            "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale,
            "enable_gqa": enable_gqa}


def _float_leaves(value: Any) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(value)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


def model_flops(model: torch.nn.Module | Callable, args: tuple = (), kwargs: dict | None = None,
                *, backward: bool = True, counter: Callable[[], Any] = flop_counter
                ) -> tuple[int, int]:
    """Forward and backward FLOPs of one call of ``model`` on these inputs.

    The backward is that of ``sum(out.sum() for out in outputs)``; summing adds
    no counted FLOPs, so this is the cost of back-propagating any scalar loss.

    >>> import torch
    >>> model_flops(torch.nn.Linear(8, 4), (torch.ones(2, 8),))
    (128, 128)
    """
    with counter() as mode:
        outputs = model(*args, **(kwargs or {}))
        forward = mode.get_total_flops()
        grads = _float_leaves(outputs)
        if backward and grads:
            loss = sum(out.sum() for out in grads)
            loss.backward()
        total = mode.get_total_flops()
    return int(forward), int(total - forward)
