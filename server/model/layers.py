"""Small building blocks of the model: RMSNorm, rotary embedding, tensor-parallel linears, linears
fused into one GEMM, SwiGLU MLP, and the scaled init that draws full weights and keeps this rank's
slice. The residual add with the next norm and SwiGLU's product are single kernels on the Triton
backend (kernels/fused.py); the rotations run inside the attention's preparation kernels
(kernels/attention_prep.py); projections of one row run as Triton GEMVs there where they beat
cuBLAS (kernels/gemv.py: `backend`, as the kernels take it), and at one row a norm or SwiGLU's
product runs inside the GEMV that reads it, one launch instead of two, for the shapes where
kernels/gemv_fused.py's `prologue_config` says the fold pays.
`GraphBranch` runs independent work as a parallel branch of a captured CUDA graph."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from kernels.fused import add_rms_norm
from kernels.gemv import linear
from kernels.gemv_fused import add_rms_norm_linear, silu_mul_linear
from server.distributed.collectives import TensorParallel


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def add(self, update: torch.Tensor | None, residual: torch.Tensor,
            backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm of residual + update, residual + update): a sub-layer's output joins the residual
        stream and the next sub-layer's input is normed, in one kernel. update None: norm only."""
        return add_rms_norm(update, residual, self.weight, self.eps, backend)

    def add_project(self, update: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor,
                    backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear(norm of residual + update, weight), residual + update): `add`, then the
        projection that reads the normed rows, in one GEMV at batch 1 for the shapes that
        kernels/gemv_fused.prologue_config folds."""
        return add_rms_norm_linear(update, residual, self.weight, self.eps, weight, backend)

    def project(self, x: torch.Tensor, weight: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        """linear(norm of x, weight): `add_project` without a residual update."""
        return self.add_project(None, x, weight, backend)[0]


class Rotary:
    """RoPE with theta; `interleaved` rotates pairs (x0, x1), (x2, x3)... (MLA's form), otherwise
    halves (x_i, x_{i+d/2}) (the indexer's form). Tables are fp32, built on the model's device."""

    def __init__(self, dim: int, max_position: int, theta: float, device: torch.device) -> None:
        inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
        self.cos = angles.cos().float().to(device)
        self.sin = angles.sin().float().to(device)

    def at(self, positions: torch.Tensor) -> RopeAngles:
        """The angles of every token's position. Gathered once per step and shared by all layers
        and by each layer's rotations: gathering per rotation cost 8 index ops per layer. Shaped
        [T, 1, dim/2] once here, to broadcast over the heads without a view per rotation."""
        return RopeAngles(self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1))


@dataclass(frozen=True)
class RopeAngles:
    """cos and sin fp32 [T, 1, dim/2] of one step's token positions (see Rotary)."""

    cos: torch.Tensor
    sin: torch.Tensor


class GraphBranch:
    """Work that a CUDA graph runs beside the current stream's: inside a graph's capture the block
    runs on a side stream forked from the current one, so the graph holds it as a parallel branch
    (kernels of either branch overlap: a decode step's small kernels each wait on their own
    latency and leave most of the GPU idle); `join` makes the current stream wait for it, and
    hands the tensors made in the branch to the current stream. Outside a capture (eager steps,
    CPU) the block runs in line, in the same order, so both paths compute the same numbers.

        with GraphBranch(x.device) as branch:
            y = f(x)  # does not read what the current stream writes until the join
        ...  # the current stream's own work
        branch.join(y)
    """

    _streams: ClassVar[dict[torch.device, torch.cuda.Stream]] = {}

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        """enabled False: always in line (steps whose kernels fill the GPU on their own, where a
        branch only adds its synchronisation: server/model/attention.py, BRANCH_MAX_TOKENS)."""
        self.stream: torch.cuda.Stream | None = None
        if device.type == "cuda":
            # Made on the first eager step, not inside a capture (a graph's shape always runs
            # eagerly once before its capture).
            if device not in self._streams:
                self._streams[device] = torch.cuda.Stream(device)
            if enabled and torch.cuda.is_current_stream_capturing():
                self.stream = self._streams[device]
        self._context: torch.cuda.StreamContext | None = None

    def __enter__(self) -> GraphBranch:
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
            self._context = torch.cuda.stream(self.stream)
            self._context.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._context is not None:
            self._context.__exit__(kind, error, trace)
            self._context = None

    def join(self, *made: torch.Tensor) -> None:
        """The current stream waits for the branch; `made`: tensors allocated in the branch and
        used after the join (the allocator then keeps their memory until the current stream is
        done with them)."""
        if self.stream is not None:
            current = torch.cuda.current_stream(self.stream.device)
            current.wait_stream(self.stream)
            for t in made:
                t.record_stream(current)


class ColumnParallelLinear(nn.Linear):
    """y = x W^T with W's output rows split across ranks: each rank returns its slice of y."""

    tp_dim = 0

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel) -> None:
        super().__init__(in_features, out_features // tp.world_size, bias=False)
        self.tp = tp

    def forward(self, x: torch.Tensor, backend: str | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """out_dtype: the result's dtype (default x's; the LM head asks for fp32 logits)."""
        return linear(x, self.weight, backend, out_dtype)


class RowParallelLinear(nn.Linear):
    """y = x W^T with W's input columns split across ranks: each rank multiplies its slice of x,
    and the partial products are summed over the ranks."""

    tp_dim = 1

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel) -> None:
        super().__init__(in_features // tp.world_size, out_features, bias=False)
        self.tp = tp

    def forward(self, x: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        return self.tp.all_reduce(linear(x, self.weight, backend))


def full_shape(layer: nn.Linear) -> list[int]:
    """The unsharded weight's shape (what a safetensors file and the random init hold)."""
    shape = list(layer.weight.shape)
    if isinstance(layer, (ColumnParallelLinear, RowParallelLinear)):
        shape[layer.tp_dim] *= layer.tp.world_size
    return shape


@torch.no_grad()
def copy_shard(layer: nn.Linear, full: torch.Tensor) -> None:
    """Copy this rank's slice of the full weight into the layer (a replicated layer: all of it)."""
    if isinstance(layer, (ColumnParallelLinear, RowParallelLinear)):
        full = full.chunk(layer.tp.world_size, layer.tp_dim)[layer.tp.rank]
    layer.weight.copy_(full)


class FusedLinears:
    """Linears that read the same input, run as one GEMM over their weights' rows stacked: at decode
    sizes each GEMM costs a few microseconds of latency whatever its width, so one launch instead of
    several is what saves time. Each layer's weight is a view of its rows of the stacked weight, so
    initialising, loading or editing a layer edits the stacked weight, and nothing is stored twice.
    The linears stay their owner's modules (names, init, checkpoints and tensor-parallel slices
    unchanged); the owner calls `restack` after a dtype or device move, which gives each parameter
    storage of its own. Anything else that replaces a weight's storage (copy.deepcopy,
    load_state_dict(assign=True)) needs a `restack` too, or the GEMM reads the old weights. The GEMM
    is the owner's, over `weight` (with the norm before it: `RMSNorm.add_project`); its output holds
    the layers' outputs side by side, which `sizes` splits."""

    def __init__(self, *layers: nn.Linear) -> None:
        self.layers = layers
        self.sizes = [layer.weight.shape[0] for layer in layers]  # this rank's rows of each
        self.weight = self.restack()

    def restack(self) -> torch.Tensor:
        """Stack the layers' current weights and make each a view of its rows again."""
        stacked = torch.cat([layer.weight.detach() for layer in self.layers])
        for layer, rows in zip(self.layers, stacked.split(self.sizes)):
            layer.weight = nn.Parameter(rows, requires_grad=False)
        self.weight = stacked
        return stacked


class OwnsFusedLinears(nn.Module):
    """A module holding FusedLinears among its attributes: restacks them after a dtype or device
    move (nn.Module._apply gives each parameter new storage of its own)."""

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> OwnsFusedLinears:
        super()._apply(fn, recurse)
        for value in vars(self).values():
            if isinstance(value, FusedLinears):
                value.restack()
        return self


class SwiGLU(OwnsFusedLinears):
    def __init__(self, hidden: int, intermediate: int, tp: TensorParallel) -> None:
        super().__init__()
        self.w_gate = ColumnParallelLinear(hidden, intermediate, tp)
        self.w_up = ColumnParallelLinear(hidden, intermediate, tp)
        self.w_down = RowParallelLinear(intermediate, hidden, tp)
        self.gate_up = FusedLinears(self.w_gate, self.w_up)

    def forward(self, gate_up: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        """w_down(silu(gate) * up) of the fused gate/up projection's output, which the caller computes
        with the norm before it (`RMSNorm.add_project` over `gate_up.weight`)."""
        return self.w_down.tp.all_reduce(silu_mul_linear(gate_up, self.w_down.weight, backend))


def init_linear(layer: nn.Linear, generator: torch.Generator, gain: float = 1.0) -> torch.Tensor:
    """Normal init with std gain / sqrt(fan_in), so each projection keeps activations near unit scale.
    Every rank draws the full weight from the same generator state and keeps its slice, so a
    sharded model holds exactly the unsharded model's numbers. Returns the full weight."""
    full = torch.empty(full_shape(layer), device=layer.weight.device)
    full.normal_(0.0, gain / math.sqrt(full.shape[1]), generator=generator)
    copy_shard(layer, full)
    return full
