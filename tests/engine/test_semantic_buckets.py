"""semantic_hash on the model's own embeddings: paraphrases share a bucket far more often than
unrelated pairs. The rates are averaged over 20 hyperplane seeds so no one lucky seed decides."""
from __future__ import annotations

import pytest

from kev.config.schema import DEFAULT_FILLER_WORDS, DEFAULT_GREETINGS
from kev.router.normalize import Normalizer
from kev.router.semantic import SimHasher

PARAPHRASES = [
    ("怎么退款", "如何退款"), ("怎么退款", "我想退款，怎么操作"), ("怎么修改地址", "如何更改收货地址"),
    ("怎么修改地址", "收货地址怎么修改"), ("订单到哪了", "我的订单现在到哪里了"),
    ("退款多久到账", "退款要多长时间才能到账"),
    ("解释一下注意力机制", "请解释注意力机制"), ("写一个Python快速排序", "用Python写快速排序"),
    ("什么是KV Cache", "解释一下什么是KV Cache"), ("今天天气怎么样", "今天的天气如何"),
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("How do I reset my password?", "How can I reset my password?"),
    ("How do I get a refund?", "How can I get a refund for my order?"),
    ("How do I change my shipping address?", "How can I update my delivery address?"),
    ("Explain the attention mechanism", "Explain how the attention mechanism works"),
    ("Write a quicksort in Python", "Write quicksort in Python"),
    ("What's the weather like today?", "How is the weather today?"),
    ("Where is my order?", "Where is my order now?"), ("Translate hello into French", "Translate 'hello' to French"),
    ("List three prime numbers", "Name three prime numbers"),
]
UNRELATED = [
    ("怎么退款", "解释一下注意力机制"), ("怎么修改地址", "写一个Python快速排序"), ("订单到哪了", "什么是KV Cache"),
    ("退款多久到账", "今天天气怎么样"), ("解释一下注意力机制", "如何更改收货地址"),
    ("写一个Python快速排序", "我想退款，怎么操作"),
    ("什么是KV Cache", "收货地址怎么修改"), ("今天天气怎么样", "我的订单现在到哪里了"),
    ("What is the capital of France?", "How do I reset my password?"),
    ("How do I get a refund?", "Write a quicksort in Python"),
    ("How do I change my shipping address?", "List three prime numbers"),
    ("Explain the attention mechanism", "Where is my order?"),
    ("What's the weather like today?", "Translate hello into French"),
    ("Write quicksort in Python", "Which city is the capital of France?"),
    ("How can I reset my password?", "Name three prime numbers"), ("怎么退款", "What is the capital of France?"),
    ("如何更改收货地址", "Explain the attention mechanism"), ("解释一下什么是KV Cache", "How is the weather today?"),
    ("用Python写快速排序", "Where is my order now?"), ("今天的天气如何", "How do I get a refund?"),
]
SEEDS = range(20)


@pytest.fixture(scope="module")
def vectors(default_model):
    from kev.engine.embedder import MeanEmbedder

    model, tokenizer = default_model
    embed = MeanEmbedder(model.embed_tokens.full_weight(), tokenizer)
    texts = {t for pair in PARAPHRASES + UNRELATED for t in pair}
    return {t: embed(t) for t in texts}


def same_bucket_rate(pairs, vectors, num_buckets: int) -> float:
    hits = 0
    for seed in SEEDS:
        hasher = SimHasher(num_buckets, seed)
        bucket = {t: hasher.bucket_of_vector(v) for t, v in vectors.items()}
        hits += sum(bucket[a] == bucket[b] for a, b in pairs)
    return hits / (len(SEEDS) * len(pairs))


@pytest.mark.parametrize("num_buckets", [16, 64])
def test_paraphrases_share_a_bucket_far_more_often_than_unrelated_pairs(vectors, num_buckets):
    paraphrase = same_bucket_rate(PARAPHRASES, vectors, num_buckets)
    unrelated = same_bucket_rate(UNRELATED, vectors, num_buckets)
    print(f"num_buckets={num_buckets}: paraphrase pairs {paraphrase:.1%} same bucket, unrelated {unrelated:.1%}")
    assert paraphrase >= 3 * unrelated and paraphrase >= 0.25


def test_normalized_variants_hash_alike(vectors, default_model):
    from kev.engine.embedder import MeanEmbedder

    normalizer = Normalizer(DEFAULT_FILLER_WORDS, DEFAULT_GREETINGS)
    embed = MeanEmbedder(default_model[0].embed_tokens.full_weight(), default_model[1])
    hasher = SimHasher(64, 0, lambda text: embed(normalizer.normalize(text)))
    variants = ["怎么退款", "嗯，怎么退款？？？", "你好，请问怎么退款", "怎么退款！！！", "那个，，怎么退款"]
    assert len({hasher.bucket(v) for v in variants}) == 1
