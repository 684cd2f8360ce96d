"""A fixed, mixed question set for benchmarks (Chinese and English, short and long)."""

BENCH_QUESTIONS: list[str] = [
    "Kev的隔离通道是如何实现的",
    "帮我总结一下Transformer的注意力机制",
    "写出一个Python快速排序示例",
    "解释一下什么是KV Cache",
    "What is the capital of France?",
    "Explain why the sky is blue in simple terms.",
    "Write a haiku about autumn leaves.",
    "List three benefits of regular exercise.",
    "解释一下注意力机制",
    "注意力机制有什么缺点",
    "How does a hash table handle collisions?",
    "Give me a recipe for a simple tomato soup.",
    "What is the difference between a process and a thread?",
    "翻译成英文：今天天气很好，我们去公园散步吧。",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "Why do cats purr?",
]
