"""Long business documents for the `documents` scenario (the article's §5.1: every document × task an isolated
question). Written here, deterministically from a seed: quarterly reports of invented companies, in English and
in Chinese, grown paragraph by paragraph to a target length in the model's tokens; each document states the
facts its tasks ask for (company, chief executive, revenue, main risk) once, among filler of the same kind."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

TASKS_EN = [
    "Extract the company's name and its total revenue for the quarter. Answer as JSON with keys company and revenue.",
    "Who is the chief executive named in the report? Answer with the name only.",
    "What is the single main risk the report names? Answer in one sentence.",
]
TASKS_ZH = [
    "提取公司名称和本季度总收入，以JSON格式回答，键为company和revenue。",
    "报告中提到的首席执行官是谁？只回答姓名。",
    "报告指出的最主要风险是什么？用一句话回答。",
]

_COMPANIES = ["Northwind Logistics", "Bluefin Analytics", "Corvid Robotics", "Halden Foods", "Kestrel Energy",
              "Lumen Textiles", "Meridian Health", "Orchard Software"]
_PEOPLE = ["Alice Chen", "Bruno Rossi", "Chidi Okafor", "Dana Levi", "Emil Novak", "Farah Haddad", "Goro Sato",
           "Hana Kim"]
_REGIONS = ["Europe", "North America", "Southeast Asia", "Latin America", "the Middle East", "East Africa"]
_LINES = ["cloud subscriptions", "field services", "spare parts", "consulting", "licences", "hardware", "training"]
_RISKS = ["a shortage of semiconductor supply", "rising freight costs", "currency swings in emerging markets",
          "the loss of its largest customer", "new data-protection rules"]
_ZH_COMPANIES = ["华东物流", "蓝鳍数据", "星河机器人", "山川食品", "青隼能源", "明光纺织", "远航医疗", "果园软件"]
_ZH_PEOPLE = ["张伟", "王芳", "李娜", "刘洋", "陈静", "杨磊", "赵敏", "黄强"]
_ZH_REGIONS = ["华东", "华南", "西南", "东南亚", "欧洲", "北美"]
_ZH_LINES = ["云订阅", "现场服务", "备件", "咨询", "软件许可", "硬件", "培训"]
_ZH_RISKS = ["芯片供应短缺", "运费上涨", "新兴市场汇率波动", "失去最大客户", "新的数据保护法规"]


@dataclass(frozen=True)
class Document:
    text: str
    language: str  # "en" or "zh"
    tasks: list[str]

    def question(self, task: int) -> str:
        """The document first, then the task: questions on one document share their whole start."""
        return f"{self.text}\n\n{self.tasks[task]}"


def _english_paragraph(rng: random.Random, company: str) -> str:
    region, line, other = rng.choice(_REGIONS), rng.choice(_LINES), rng.choice(_PEOPLE)
    growth, share, staff = rng.randint(-9, 25), rng.randint(5, 60), rng.randint(12, 900)
    return (f"In {region}, sales of {line} changed by {growth}% against the same quarter last year and now make up "
            f"{share}% of the region's orders. {other}, who leads the {region} team of {staff} people, expects "
            f"demand for {line} to {'grow' if growth > 0 else 'recover'} as customers renew their contracts, and "
            f"{company} plans to open {rng.randint(1, 6)} new offices there before the end of the year.")


def _chinese_paragraph(rng: random.Random, company: str) -> str:
    region, line, other = rng.choice(_ZH_REGIONS), rng.choice(_ZH_LINES), rng.choice(_ZH_PEOPLE)
    growth, share, staff = rng.randint(-9, 25), rng.randint(5, 60), rng.randint(12, 900)
    trend = "继续增长" if growth > 0 else "逐步恢复"
    return (f"在{region}地区，{line}业务的销售额同比变化{growth}%，目前占该地区订单的{share}%。"
            f"负责{region}团队（共{staff}人）的{other}预计，随着客户续签合同，{line}的需求将会{trend}。"
            f"{company}计划在年底前于该地区新设{rng.randint(1, 6)}个办公室。")


def _facts(rng: random.Random, language: str) -> tuple[str, str]:
    """The opening (company, chief executive, revenue) and the risk sentence, and the company's name."""
    if language == "en":
        company, ceo, risk = rng.choice(_COMPANIES), rng.choice(_PEOPLE), rng.choice(_RISKS)
        revenue = f"${rng.randint(20, 900)}.{rng.randint(0, 9)} million"
        opening = (f"Quarterly report of {company}. Chief executive: {ceo}. Total revenue for the quarter was "
                   f"{revenue}, and the board names {risk} as the main risk for the coming year.")
        return opening, company
    company, ceo, risk = rng.choice(_ZH_COMPANIES), rng.choice(_ZH_PEOPLE), rng.choice(_ZH_RISKS)
    revenue = f"{rng.randint(2, 90)}.{rng.randint(0, 9)}亿元"
    opening = f"{company}季度报告。首席执行官：{ceo}。本季度总收入为{revenue}，董事会认为{risk}是来年的主要风险。"
    return opening, company


def make_document(seed: int, language: str, target_tokens: int, count_tokens: Callable[[str], int]) -> Document:
    """A report of about target_tokens tokens (the first paragraph that reaches it ends it)."""
    rng = random.Random(f"{language}-{seed}")
    opening, company = _facts(rng, language)
    paragraph = _english_paragraph if language == "en" else _chinese_paragraph
    parts = [opening]
    while count_tokens("\n".join(parts)) < target_tokens:
        parts.append(paragraph(rng, company))
    return Document("\n".join(parts), language, TASKS_EN if language == "en" else TASKS_ZH)


def document_set(count: int, target_tokens: int, count_tokens: Callable[[str], int]) -> list[Document]:
    """count documents, English and Chinese alternating."""
    return [make_document(i, "en" if i % 2 == 0 else "zh", target_tokens, count_tokens) for i in range(count)]
