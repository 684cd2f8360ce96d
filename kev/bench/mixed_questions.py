"""The mixed batch: what Kev's users send — a pile of document-extraction prompts (150–400 tokens)
among many short questions, Chinese and English. Built deterministically from a seed, so every
engine in a side-by-side run answers exactly the same list."""
from __future__ import annotations

import random

from kev.bench.questions import BENCH_QUESTIONS

_NAMES = ["Alice Chen", "Bruno Rossi", "Chidi Okafor", "Dana Levi", "Emil Novak", "Farah Haddad", "Goro Sato",
          "Hana Kim", "Ines Duarte", "Jonas Berg"]
_CITIES = ["Lisbon", "Osaka", "Nairobi", "Toronto", "Krakow", "Austin", "Lyon", "Pune"]
_ITEMS = ["laptop stands", "USB-C cables", "office chairs", "monitors", "keyboards", "desk lamps", "webcams"]
_ZH_NAMES = ["张伟", "王芳", "李娜", "刘洋", "陈静", "杨磊", "赵敏", "黄强"]
_ZH_CITIES = ["上海", "深圳", "成都", "杭州", "武汉", "西安"]
_ZH_ITEMS = ["笔记本电脑", "显示器", "办公椅", "打印机", "路由器", "投影仪"]

_SHORT_EXTRA = [
    "What is 17 times 23?", "Name a primary colour.", "Who wrote Hamlet?", "Define entropy in one sentence.",
    "Is a tomato a fruit?", "什么是机器学习？", "北京是哪个国家的首都？", "用一句话介绍长城。",
    "What does HTTP stand for?", "Give one synonym for happy.", "一年有几个季节？", "Translate 'thank you' to French.",
    "What is the boiling point of water in Celsius?", "列出三种水果。", "What is a prime number?",
    "Why is the ocean salty?",
]


def _english_document(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(3, 7)):
        name, city, item = rng.choice(_NAMES), rng.choice(_CITIES), rng.choice(_ITEMS)
        qty, price, day = rng.randint(2, 90), rng.randint(15, 900), rng.randint(1, 28)
        lines.append(f"On March {day}, {name} from the {city} office ordered {qty} {item} at ${price} each; "
                     f"the order was approved by {rng.choice(_NAMES)} and shipped {rng.randint(1, 9)} days later.")
    task = rng.choice(["List every person named and their city as JSON.", "What is the total number of items ordered?",
                       "Which office ordered the most expensive item? Answer briefly.",
                       "Summarise these orders in two sentences."])
    return "Read the following purchase log.\n\n" + "\n".join(lines) + "\n\n" + task


def _chinese_document(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(2, 4)):
        name, city, item = rng.choice(_ZH_NAMES), rng.choice(_ZH_CITIES), rng.choice(_ZH_ITEMS)
        lines.append(f"{rng.randint(1, 12)}月{rng.randint(1, 28)}日，{city}分公司的{name}"
                     f"采购了{rng.randint(2, 60)}台{item}，单价{rng.randint(300, 9000)}元，"
                     f"由{rng.choice(_ZH_NAMES)}审批。")
    task = rng.choice(["请列出所有采购人及其城市。", "总共采购了多少台设备？", "请用两句话总结这些采购记录。"])
    return "请阅读以下采购记录：\n" + "\n".join(lines) + "\n" + task


def mixed_questions(num_long: int = 32, num_short: int = 128, seed: int = 0) -> list[str]:
    """num_long extraction prompts (half English, half Chinese) spread among num_short short questions."""
    rng = random.Random(seed)
    long = [_english_document(rng) if i % 2 == 0 else _chinese_document(rng) for i in range(num_long)]
    pool = BENCH_QUESTIONS + _SHORT_EXTRA
    short = [pool[i % len(pool)] if i < len(pool) else f"{pool[i % len(pool)]} (#{i})" for i in range(num_short)]
    questions = long + short
    rng.shuffle(questions)
    return questions
