"""semantic_hash: SimHash of a question's embedding into router.num_buckets buckets; bucket → channel.

Seeded random hyperplanes through the origin; bit i says which side of hyperplane i the
vector lies on. Vectors at a small angle agree on most bits, so paraphrases tend to share
a bucket (P[same bit] = 1 - angle/π). The vector comes from a pluggable encoder (the engine
passes the mean of the model's input embeddings); without one the bucket is a plain hash
of the text, so equal texts still share a bucket.
"""
from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence

from kev.router.features import PoolView, QuestionFeatures

Encoder = Callable[[str], Sequence[float]]


class SimHasher:
    def __init__(self, num_buckets: int, seed: int, encoder: Encoder | None = None) -> None:
        self.num_buckets, self.seed, self.encoder = num_buckets, seed, encoder
        self.num_bits = num_buckets.bit_length() - 1  # num_buckets is a power of two
        self._planes: list[list[float]] = []  # [num_bits][dim], made on the first vector

    def bucket(self, text: str) -> int:
        if self.num_bits == 0:
            return 0
        if self.encoder is None:
            digest = hashlib.blake2b(text.encode(), digest_size=8, key=str(self.seed).encode()).digest()
            return int.from_bytes(digest, "little") % self.num_buckets
        return self.bucket_of_vector(self.encoder(text))

    def bucket_of_vector(self, vector: Sequence[float]) -> int:
        if len(self._planes) != self.num_bits or len(self._planes[0]) != len(vector):
            rng = random.Random(self.seed)
            self._planes = [[rng.gauss(0.0, 1.0) for _ in vector] for _ in range(self.num_bits)]
        bits = (math.fsum(p * v for p, v in zip(plane, vector)) > 0.0 for plane in self._planes)
        return sum(int(bit) << i for i, bit in enumerate(bits))


class SemanticHash:
    name = "semantic_hash"

    def choose(self, features: QuestionFeatures, channels: Sequence[int], view: PoolView) -> int:
        return channels[features.bucket % len(channels)]
