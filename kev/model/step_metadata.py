"""StepMetadata: the one object the engine's bookkeeping and the model's math both touch.

It describes a packed step as per-channel spans over one flat token batch and the
paged KV cache. There is no [T, T] mask: attention of a channel is computed from its
own span and its own key slots, so block-diagonal isolation is structural.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch

# Attention paths (model/attention.py). In bf16 with the AVX-512 BF16 kernels, decode rows take the row kernel
# (cpu_kernels/paged_attention.cpp) and every prefill chunk, whatever its length, the flash-style prefill kernel
# (cpu_kernels/prefill_attention.cpp); otherwise every row takes the row kernel. Both compute a row from its own
# channel's keys in an order fixed by its own position, so a row's bits never depend on how its prompt was
# chunked or on what else is in the step.


@dataclass
class ChannelSpan:
    """One channel's part of the step."""

    channel_id: int
    q_start: int  # first row of this channel in the packed batch
    q_len: int  # rows it contributes this step
    ctx_len: int  # keys it attends to (cached + new), ending at its last new token
    kv_slots: torch.Tensor  # [ctx_len] cache slots of those keys, in position order
    attn_mask: torch.Tensor | None  # [q_len, ctx_len] bool; None when is_causal or q_len == 1
    is_causal: bool  # the chunk starts at position 0 (q_len == ctx_len): plain causal
    prefix_len: int = 0  # leading keys that are an attached shared prefix (the audit's allowed span)
    decode: bool = False  # a sampled token's row (not part of a prompt): the row kernel even beside prefill


@dataclass
class StepMetadata:
    input_ids: torch.Tensor  # [num_rows]: real tokens plus zero padding that fills each tile
    positions: torch.Tensor  # [num_rows] restart at 0 in every channel
    tiles: list[int]  # row-tile sizes in order, sum == num_rows (see model/linear.py)
    token_rows: torch.Tensor  # [num_tokens] rows holding real tokens
    slot_mapping: torch.Tensor  # [num_tokens] cache slot where each real token's K/V goes
    spans: list[ChannelSpan]
    sample_rows: torch.Tensor  # [num_samples] rows whose next-token logits are needed
    sample_tiles: list[int]  # row tiles of the lm_head GEMM over the sampled rows (padded)
    paged: PagedRows | None = None  # the rows as device kernels read them (CUDA's Triton path), else None
    # [num_samples] bool: rows whose logits are read for their argmax alone (Work.argmax_only), which a head that
    # keeps only each row's maximum exact may serve (kev/model/head_rescoring.py); None: every row whole
    argmax_only: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.numel()

    @cached_property
    def padding_rows(self) -> torch.Tensor | None:
        """Rows that hold no token (tile or minimum-size padding), or None."""
        num_rows = self.input_ids.numel()
        if num_rows == self.num_tokens:
            return None
        mask = torch.ones(num_rows, dtype=torch.bool, device=self.input_ids.device)
        mask[self.token_rows] = False
        return mask.nonzero().flatten()

    @cached_property
    def kernel_batch(self) -> KernelBatch | None:
        """Every row, for the row kernel (None when the step has none)."""
        return KernelBatch.build(self.spans) if self.spans else None

    @cached_property
    def decode_batch(self) -> KernelBatch | None:
        """Decode rows only, for the row kernel beside the prefill kernel."""
        spans = [span for span in self.spans if span.decode]
        return KernelBatch.build(spans) if spans else None

    @cached_property
    def prefill_batch(self) -> PrefillBatch | None:
        """Prompt chunks, for the prefill kernel (None when the step has none)."""
        spans = [span for span in self.spans if not span.decode]
        return PrefillBatch.build(spans) if spans else None


@dataclass
class PrefillBatch:
    """Prompt chunks for cpu_kernels/prefill_attention.cpp: chunk i's rows are spans[i] = (q_start, q_len, ctx_len,
    slot_offset); they are the last q_len positions of a context whose ctx_len key slots start at slot_offset."""

    spans: torch.Tensor  # [n, 4] int64
    kv_slots: torch.Tensor  # every chunk's context slots in position order, one chunk after another

    @staticmethod
    def build(spans: list[ChannelSpan]) -> PrefillBatch:
        rows, offset = [], 0
        for s in spans:
            rows.append([s.q_start, s.q_len, s.ctx_len, offset])
            offset += s.ctx_len
        device = spans[0].kv_slots.device
        return PrefillBatch(torch.tensor(rows, dtype=torch.long, device=device),
                            torch.cat([s.kv_slots for s in spans]))


@dataclass
class KernelBatch:
    """Query rows as flat arrays: row i attends to kv_slots[starts[i] : starts[i] + lengths[i]]."""

    rows: torch.Tensor  # [Q] query rows
    kv_slots: torch.Tensor  # every channel's key slots in position order, one channel after another
    starts: torch.Tensor  # [Q] where row i's channel begins in kv_slots
    lengths: torch.Tensor  # [Q] keys row i sees (causal within its chunk)

    @staticmethod
    def build(spans: list[ChannelSpan]) -> KernelBatch:
        device = spans[0].kv_slots.device
        rows: list[int] = []
        starts: list[int] = []
        lengths: list[int] = []
        offset = 0
        for s in spans:
            first_position = s.ctx_len - s.q_len
            rows.extend(range(s.q_start, s.q_start + s.q_len))
            starts.extend([offset] * s.q_len)
            lengths.extend(range(first_position + 1, s.ctx_len + 1))
            offset += s.ctx_len
        as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        return KernelBatch(as_tensor(rows), torch.cat([s.kv_slots for s in spans]), as_tensor(starts),
                           as_tensor(lengths))

    def windowed(self, window: int) -> KernelBatch:
        """The same rows over only their last `window` keys (a sliding-window layer): the start moves, nothing else."""
        hidden = (self.lengths - window).clamp(min=0)
        return KernelBatch(self.rows, self.kv_slots, self.starts + hidden, self.lengths - hidden)


# Columns of PagedRows.host before each row's block table.
ID, POSITION, SLOT, LENGTH, TABLE = range(5)


@dataclass
class PagedRows:
    """Every row of a step as the device kernels read it, in one int64 table built on the host:
    [rows, 4 + width] = input id, position, cache slot of its new key (-1: a padding row writes none), keys it sees
    (0: padding), then its channel's block table (width: the step's longest, zero-padded). `flat` lays it out as the
    device buffer the kernels read, so a step's metadata reaches the device in one copy."""

    host: torch.Tensor  # [rows, 4 + width] int64 on the CPU
    block_size: int
    device: torch.device
    static: DeviceRows | None = None  # a graphed step's fixed buffers (engine/decode_graphs.py); None: made on use

    @staticmethod
    def build(spans: list[ChannelSpan], tables: dict[int, list[int]], ids: list[int], positions: list[int],
              token_rows: list[int], slot_mapping: list[int], block_size: int, device: torch.device) -> PagedRows:
        width = max([-(-s.ctx_len // block_size) for s in spans] + [1])
        host = torch.zeros(len(ids), TABLE + width, dtype=torch.long)
        host[:, ID], host[:, POSITION], host[:, SLOT] = torch.tensor(ids), torch.tensor(positions), -1
        host[token_rows, SLOT] = torch.tensor(slot_mapping, dtype=torch.long)
        for span in spans:
            rows = slice(span.q_start, span.q_start + span.q_len)
            host[rows, LENGTH] = torch.arange(span.ctx_len - span.q_len + 1, span.ctx_len + 1)  # causal in its chunk
            used = tables[span.channel_id][: -(-span.ctx_len // block_size)]
            host[rows, TABLE: TABLE + len(used)] = torch.tensor(used, dtype=torch.long)
        return PagedRows(host, block_size, device)

    def on_device(self, meta: StepMetadata) -> StepMetadata:
        """meta (built on the host) with what the model's forward reads on the device: ids and positions from the one
        copy of the rows, and the sampled rows."""
        views = self.views
        return replace(meta, input_ids=views.input_ids, positions=views.positions,
                       sample_rows=meta.sample_rows.to(self.device, non_blocking=True))

    def flat(self, rows: int, width: int) -> torch.Tensor:
        """[rows * (4 + width)]: ids, positions, slots, lengths (rows each), then the tables row by row; rows and width
        pad the step's own (padding rows: slot -1, length 0)."""
        host = self.host
        out = torch.zeros(rows, TABLE + width, dtype=torch.long)
        out[:, SLOT] = -1
        out[: host.shape[0], : host.shape[1]] = host
        return torch.cat([out[:, :TABLE].T.flatten(), out[:, TABLE:].flatten()])

    @property
    def views(self) -> DeviceRows:
        """The step's rows on the device (one copy, made on first use)."""
        if self.static is None:
            rows, width = self.host.shape[0], self.host.shape[1] - TABLE
            self.static = DeviceRows.over(self.flat(rows, width).to(self.device), rows, width, self.block_size)
        return self.static


@dataclass
class DeviceRows:
    """Views of one flat device buffer (PagedRows.flat): what the kernels and the graphed step read."""

    input_ids: torch.Tensor  # [rows]
    positions: torch.Tensor  # [rows]
    slots: torch.Tensor  # [rows], -1: write no key
    lengths: torch.Tensor  # [rows], keys the row sees
    tables: torch.Tensor  # [rows, width] block ids of the row's channel
    block_size: int

    @staticmethod
    def over(buffer: torch.Tensor, rows: int, width: int, block_size: int) -> DeviceRows:
        columns = buffer[: TABLE * rows].view(TABLE, rows)
        tables = buffer[TABLE * rows: rows * (TABLE + width)].view(rows, width)
        return DeviceRows(columns[ID], columns[POSITION], columns[SLOT], columns[LENGTH], tables, block_size)
