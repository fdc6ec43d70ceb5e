"""Per-request recurrent state for the GDN layers: one slot per running request, slot 0 a dummy."""
from __future__ import annotations

import torch


class StatePool:
    """conv: [num_gdn_layers, slots + 1, conv_dim, kernel - 1] in the model dtype;
    ssm: [num_gdn_layers, slots + 1, HV, K, V] in `ssm_dtype` (fp32 by default: the recurrence
    accumulates over the whole sequence, so bf16 state drifts).
    """

    def __init__(
        self,
        layer_ids: tuple[int, ...],
        max_slots: int,
        conv_dim: int,
        conv_kernel: int,
        num_value_heads: int,
        key_head_dim: int,
        value_head_dim: int,
        conv_dtype: torch.dtype,
        ssm_dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self._index = {layer: i for i, layer in enumerate(layer_ids)}
        n = len(layer_ids)
        self.conv = torch.zeros((n, max_slots + 1, conv_dim, conv_kernel - 1), dtype=conv_dtype, device=device)
        self.ssm = torch.zeros(
            (n, max_slots + 1, num_value_heads, key_head_dim, value_head_dim), dtype=ssm_dtype, device=device
        )

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._index[layer_id]
        return self.conv[i], self.ssm[i]

    def reset(self, slot: int) -> None:
        """A new request starts from zero state; zeroing once at allocation lets every kernel
        read its initial state from the slot without a has-initial-state flag."""
        self.conv[:, slot].zero_()
        self.ssm[:, slot].zero_()

    def copy(self, src: int, dst: int) -> None:
        self.conv[:, dst].copy_(self.conv[:, src])
        self.ssm[:, dst].copy_(self.ssm[:, src])

    @property
    def bytes_per_slot(self) -> int:
        return (self.conv[:, 0].nbytes + self.ssm[:, 0].nbytes)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes
