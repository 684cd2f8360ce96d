"""MeanEmbedder: the router's encoder, a question's vector from the model's own input embeddings.

The mean of the input embeddings of the question's tokens, with the embedding table's mean
and its top principal direction removed ("all-but-the-top", Mu & Viswanath 2018): raw
token embeddings share one large common direction, which makes every two texts look alike
to SimHash. The router itself never sees a tensor, only a list of floats.

A question's vector is computed with numpy: it runs on the submitting thread, and a torch op
there could start a second OpenMP pool, which slows the engine loop's GEMMs (docs/design.md).
"""
from __future__ import annotations

import torch

from kev.model.tokenizer import Tokenizer

_SAMPLE_ROWS = 8192  # rows of the table used to find the common direction (seeded, fixed)


class MeanEmbedder:
    def __init__(self, embed_weight: torch.Tensor, tokenizer: Tokenizer) -> None:
        weight = embed_weight.detach().float().cpu()  # [vocab, hidden]
        self.tokenizer = tokenizer
        center = weight.mean(0)  # [hidden]
        rows = torch.randperm(weight.shape[0], generator=torch.Generator().manual_seed(0))[:_SAMPLE_ROWS]
        sample = weight[rows] - center  # [rows, hidden]
        _, vectors = torch.linalg.eigh(sample.T @ sample)  # ascending eigenvalues, [hidden, hidden]
        self.table, self.center, self.top = weight.numpy(), center.numpy(), vectors[:, -1].numpy()

    def __call__(self, text: str) -> list[float]:
        ids = self.tokenizer.encode(text) or [0]
        v = self.table[ids].mean(0) - self.center  # [hidden]
        return (v - self.top * (self.top @ v)).tolist()
