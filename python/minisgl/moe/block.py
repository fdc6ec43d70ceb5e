"""What every MoE block holds, colocated (moe/local_moe.py) or on an AFD attention worker
(afd/remote_moe.py): the router gate and the optional shared expert, scaled by its own sigmoid
gate. Parameter names are the checkpoint's (gate, shared_expert, shared_expert_gate). Both take the
block's input as Activations too, so on FP8 weights it is quantised once for all its readers."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels.activations import Activations
from minisgl.layers.fp8_linear import Fp8Linear
from minisgl.layers.linear import Linear, column_parallel, row_parallel
from minisgl.layers.row_stack import RowStack, layer_outputs, row_stack_fits
from minisgl.moe.router import route
from minisgl.moe.shared_addend import SharedAddend
from minisgl.parallel.config import SINGLE, ParallelConfig


class SharedExpert(nn.Module):
    """SwiGLU MLP whose output is scaled by sigmoid(x · shared_expert_gate). Under TP a rank holds
    its slice of the intermediate dim; its output is then a partial sum. On FP8 weights (GPU) the
    SwiGLU and down's quantisation are one kernel (kernels/swiglu_quant.py), bit for bit the torch
    path's h and codes."""

    def __init__(self, hidden: int, intermediate: int, parallel: ParallelConfig = SINGLE) -> None:
        super().__init__()
        part = (parallel.part(intermediate),) if parallel.tp_size > 1 else ()
        self.gate_proj = column_parallel(hidden, intermediate, *part)
        self.up_proj = column_parallel(hidden, intermediate, *part)
        self.down_proj = row_parallel(intermediate, hidden, *part)
        self.gate_up: RowStack | None = None  # gate's and up's weights in one storage (stack_rows)

    def stack_rows(self, device: torch.device) -> None:
        """Called by materialize once the layers' dtypes are final: gate and up as one GEMM where
        their weights can share one storage (layers/row_stack.py)."""
        if row_stack_fits((self.gate_proj, self.up_proj)):
            self.gate_up = RowStack((self.gate_proj, self.up_proj), device)

    def forward(self, x: torch.Tensor | Activations) -> torch.Tensor:
        x = Activations.of(x)  # gate and up quantise it once
        if isinstance(self.down_proj, Fp8Linear) and self.gate_up is not None and self.gate_up.scale is not None:
            # FP8 on the GPU: SwiGLU and down's quantisation in one pass over the stacked output.
            from minisgl.kernels.swiglu_quant import swiglu_quantised  # here: CPU installs have no triton

            return self.down_proj(swiglu_quantised(self.gate_up.output(x)))
        gate, up = layer_outputs(self.gate_up, (self.gate_proj, self.up_proj), x)
        return self.down_proj(F.silu(gate) * up)


class MoEBlock(nn.Module):
    def __init__(self, hidden: int, num_experts: int, top_k: int, renormalize: bool, parallel: ParallelConfig) -> None:
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.parallel = parallel
        self.gate = Linear(hidden, num_experts)
        self.shared_expert: SharedExpert | None = None
        self.shared_expert_gate: Linear | None = None

    def add_shared_expert(self, hidden: int, intermediate: int) -> None:
        """Called by a subclass once its own params exist. 0 = the model has none (Qwen3-MoE)."""
        if intermediate:
            self.shared_expert = SharedExpert(hidden, intermediate, self.parallel)
            self.shared_expert_gate = Linear(hidden, 1)

    @property
    def reads_fp8(self) -> bool:
        """Whether a reader of the block's input quantises it (an FP8 projection): then the norm
        before the block writes the codes (layers/norm.py)."""
        return self.shared_expert is not None and isinstance(self.shared_expert.gate_proj, Fp8Linear)

    def route(self, x: torch.Tensor | Activations) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), each [T, top_k]."""
        return route(self.gate(x), self.top_k, self.renormalize)

    def shared_addend(self, x: torch.Tensor | Activations) -> SharedAddend | None:
        """The shared expert's output (this rank's partial sum under TP) and its gate's logit, for a
        backend to add to the routed sum; None without a shared expert."""
        if self.shared_expert is None:
            return None
        return SharedAddend(self.shared_expert(x), self.shared_expert_gate(x))

    def shared(self, x: torch.Tensor | Activations) -> torch.Tensor | None:
        """The gated shared expert's output, or None without one."""
        addend = self.shared_addend(x)
        return None if addend is None else addend.gated()
