"""Tensor parallelism: one model's layers split over N ranks, Megatron-style.

Each rank keeps whole key/value heads (and the query heads of their groups) and a slice of the MLP's
intermediate columns: qkv_proj and gate_up_proj are cut by output rows, part by part (q, k and v by heads,
gate and up by columns) and re-fused per rank; o_proj and down_proj by input columns, followed by one sum
over the ranks. Embeddings, norms and lm_head stay whole on every rank, so every rank holds the same
residual stream and computes the same logits.

The sum is an all-gather of the partial outputs, then an fp32 addition in rank order on every rank:
its bits depend on neither the batch nor the collective's algorithm (a ring all-reduce adds in an order
that follows the tensor's size, which follows the batch), and every rank gets the same bits.
Heads and columns need not divide evenly (SmolLM2-135M has 3 key/value heads): rank r takes the r-th of
N near-equal ranges, so N may be anything up to the number of key/value heads.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kev.errors import ConfigError
from kev.model.linear import GemmWeight, Linear
from kev.model.llama import MLP, Attention, LlamaModel
from kev.model.quant_weight import QuantLinear


def split_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """The index-th of `parts` near-equal ranges of range(size): [start, stop); the first ones get the remainder."""
    base, extra = divmod(size, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


@dataclass
class TensorGroup:
    """The ranks of one tensor-parallel model. Rank 0 runs the engine; the process group is this object's own,
    not torch.distributed's global default, so several groups (multi_gpu replicas) can live in one process."""

    rank: int
    world: int
    process_group: Any  # dist.ProcessGroupGloo | ProcessGroupNCCL (torch's stubs do not list their allgather)
    backend: str  # nccl | gloo
    staged: bool  # gloo over CUDA tensors (ranks sharing one device): gather through host memory
    store: dist.Store  # where the ranks met (rank 0 serves it for as long as the group lives)

    @staticmethod
    def connect(store: dist.Store, rank: int, world: int, device: torch.device, timeout_s: float) -> TensorGroup:
        """Join the group that meets at `store` (rank 0 serves it); returns once every rank has joined. NCCL when
        every rank has its own CUDA device, gloo otherwise; a collective that waits longer than timeout_s raises."""
        timeout = timedelta(seconds=timeout_s)
        nccl = device.type == "cuda" and dist.is_nccl_available() and _distinct_cuda_devices(store, rank, world, device)
        group: dist.ProcessGroupGloo | dist.ProcessGroupNCCL
        if nccl:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            group = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, world, options)
        else:
            group = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world, timeout)
        return TensorGroup(rank, world, group, "nccl" if nccl else "gloo", device.type == "cuda" and not nccl, store)

    def sum(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `partial` (same shape on each), added in rank order in fp32, in partial's dtype."""
        local = partial.cpu() if self.staged else partial.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world)]
        self.process_group.allgather([parts], [local]).wait()
        total = parts[0].float()
        for part in parts[1:]:
            total.add_(part)
        return total.to(device=partial.device, dtype=partial.dtype)


def _distinct_cuda_devices(store: dist.Store, rank: int, world: int, device: torch.device) -> bool:
    """Whether the ranks' CUDA devices are all different (NCCL refuses two ranks on one device)."""
    store.set(f"device{rank}", str(device.index or 0))
    seen = {store.get(f"device{r}").decode() for r in range(world)}
    return len(seen) == world


class RowParallelLinear(Linear):
    """A linear cut by input columns: each rank multiplies its slice, then the partial outputs are summed over the
    ranks. A bias is added once, by rank 0."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: TensorGroup) -> None:
        super().__init__(in_features, out_features, bias)
        self.group = group

    def forward(self, x: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        return self.group.sum(super().forward(x, tiles))  # [rows, out_features]


def check_shardable(model: LlamaModel, world: int) -> None:
    """ConfigError when the model cannot be split over `world` ranks."""
    cfg = model.config
    if any(isinstance(module, RowParallelLinear) for module in model.modules()):
        raise ConfigError("core.tensor_parallel: this model is already one rank's shard; split the loaded model")
    if world > cfg.num_kv_heads:
        raise ConfigError(f"core.tensor_parallel ({world}) exceeds the model's {cfg.num_kv_heads} key/value heads "
                          "(each rank keeps whole heads)")
    for layer in model.layers:
        if not (isinstance(layer.self_attn, Attention) and isinstance(layer.mlp, MLP)):
            raise ConfigError(f"core.tensor_parallel: {cfg.model_type} layers are not the Llama shape Kev splits")
        for linear in _linears(layer.self_attn, layer.mlp):
            if type(linear) is not Linear:
                raise ConfigError(f"core.tensor_parallel: {type(linear).__name__} layers are not split yet")
            if isinstance(linear.packed, QuantLinear):  # (a float weight prepacked for oneDNN or Kev's GEMM splits)
                raise ConfigError("core.tensor_parallel: core.precision gguf and w8a8 hold their weights in blocks, "
                                  "which are not split yet; use bf16, fp32 or int8")


def shard_model(model: LlamaModel, group: TensorGroup) -> LlamaModel:
    """This rank's copy of the model: split layers, whole embeddings/norms/lm_head (copies: prepacking a Linear
    replaces its weight in place). `model` itself is left as it was, so a caller may share it (multi_gpu replicas,
    tests), prepacked or not."""
    check_shardable(model, group.world)
    wholes = [_blocks(layer) for layer in model.layers]
    # The linears to split are replaced below: not worth copying (the copy holds None until then).
    skipped: dict[int, object] = {id(linear): None for attn, mlp in wholes for linear in _linears(attn, mlp)}
    shard = copy.deepcopy(model, memo=skipped)
    shard.fused_layers = None  # the sums run between layers: the Python layer loop
    for (whole_attn, whole_mlp), layer in zip(wholes, shard.layers):
        attn, mlp = _blocks(layer)
        attn.qkv_proj, attn.o_proj = whole_attn.qkv_proj, whole_attn.o_proj  # read, never changed
        mlp.gate_up_proj, mlp.down_proj = whole_mlp.gate_up_proj, whole_mlp.down_proj
        _shard_attention(attn, group)
        _shard_mlp(mlp, model.config.intermediate_size, group)
    return shard


def _blocks(layer: nn.Module) -> tuple[Attention, MLP]:
    attn, mlp = layer.self_attn, layer.mlp
    assert isinstance(attn, Attention) and isinstance(mlp, MLP)  # check_shardable
    return attn, mlp


def _linears(attn: Attention, mlp: MLP) -> tuple[Linear, Linear, Linear, Linear]:
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _shard_attention(attn: Attention, group: TensorGroup) -> None:
    dim, per_group = attn.head_dim, attn.num_heads // attn.num_kv_heads
    kv_start, kv_stop = split_range(attn.num_kv_heads, group.world, group.rank)
    q_size, kv_size = attn.split_sizes[0], attn.split_sizes[1]
    q_rows = (kv_start * per_group * dim, kv_stop * per_group * dim)
    k_rows = (q_size + kv_start * dim, q_size + kv_stop * dim)
    v_rows = (q_size + kv_size + kv_start * dim, q_size + kv_size + kv_stop * dim)
    attn.qkv_proj = _column_slices(attn.qkv_proj, [q_rows, k_rows, v_rows])
    attn.o_proj = _row_slice(attn.o_proj, q_rows, group)
    attn.num_kv_heads = kv_stop - kv_start
    attn.num_heads = attn.num_kv_heads * per_group
    attn.split_sizes = [attn.num_heads * dim, attn.num_kv_heads * dim, attn.num_kv_heads * dim]


def _shard_mlp(mlp: MLP, intermediate: int, group: TensorGroup) -> None:
    start, stop = split_range(intermediate, group.world, group.rank)
    mlp.gate_up_proj = _column_slices(mlp.gate_up_proj, [(start, stop), (intermediate + start, intermediate + stop)])
    mlp.down_proj = _row_slice(mlp.down_proj, (start, stop), group)


def _column_slices(linear: Linear, ranges: list[tuple[int, int]]) -> Linear:
    """The output rows in `ranges` of a fused linear, fused again in order."""
    whole = _weight(linear)
    weight = torch.cat([whole[a:b] for a, b in ranges])  # [out_shard, in_features]
    cut = Linear(weight.shape[1], weight.shape[0], linear.bias is not None)
    cut.weight = nn.Parameter(weight, requires_grad=False)
    if linear.scale is not None:  # int8: each output row keeps its scale
        cut.scale = torch.cat([linear.scale[a:b] for a, b in ranges])
    if linear.bias is not None:
        cut.bias = nn.Parameter(torch.cat([linear.bias[a:b] for a, b in ranges]), requires_grad=False)
    return cut


def _row_slice(linear: Linear, columns: tuple[int, int], group: TensorGroup) -> RowParallelLinear:
    weight = _weight(linear)[:, columns[0]:columns[1]].contiguous()  # [out_features, in_shard]
    cut = RowParallelLinear(weight.shape[1], weight.shape[0], linear.bias is not None and group.rank == 0, group)
    cut.weight = nn.Parameter(weight, requires_grad=False)
    # int8: every rank scales its partial sums by the whole row's scale; the sum over ranks is then scaled too.
    cut.scale = None if linear.scale is None else linear.scale.clone()
    if cut.bias is not None and linear.bias is not None:
        cut.bias = nn.Parameter(linear.bias.clone(), requires_grad=False)
    return cut


def _weight(linear: Linear) -> torch.Tensor:
    """W [out, in] as the model holds it (Kev's GEMM packing keeps the only copy once prepacked)."""
    return linear.packed.unpack() if isinstance(linear.packed, GemmWeight) else linear.weight
