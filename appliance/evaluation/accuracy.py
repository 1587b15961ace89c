"""Offline accuracy sets and their scoring: the accuracy step of the gate. Pure and deterministic.

DOMAIN §7 (seeds 003/004): accuracy runs only after throughput passes and has the final veto; 003
rolls back at an accuracy drop > 3 %; 004's sets are HotpotQA (multi-hop QA, F1), GovReport
(summarisation, ROUGE), Retrieval Multi Point and Keyword Aggregation (answers matched item by
item). Nothing can be downloaded at run time, so the project generates four sets of the same kinds
from a seed, each item with its exact answer:

- `multihop_qa`: a passage in which an object is kept in a place and the place lies in a city; the
  question asks for the city (two hops). Scored like HotpotQA: 1 when the normalised answer appears
  in the output, otherwise SQuAD token F1.
- `summarization`: a report of key sentences buried in routine ones; the reference summary is the key
  sentences. Scored with ROUGE-L F1 from Google's `rouge-score` package (stemming on).
- `retrieval_multi_point`: several "the code of NAME is NUMBER" facts in a long filler context; the
  question asks for three of them. Score: the share of the asked values present in the output.
- `keyword_aggregation`: a long log of entries, each tagged with one keyword; three keywords occur
  far more often than the rest (distinct counts). Score: the share of the top three named.

Words come from a sha256 counter stream (not `random`, whose algorithms may change between Python
versions), so item i of a set is the same text on every host. The context length follows the tiers'
scaling rule (appliance/evaluation/bench_tiers.py): the long-context kinds are sized for the 8–16K
tier scaled into the baseline's context, the passage kinds for the 4–8K tier. The small model's
absolute accuracy does not matter: the gate compares the two arms item by item.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections import Counter
from collections.abc import Sequence
from enum import StrEnum
from functools import cache
from typing import Any

from pydantic import BaseModel, Field

ACCURACY_SET_VERSION = "acc-v1"
ITEMS_PER_KIND = 5  # DOMAIN §7 / seed 004 §5.5: the local accuracy gate used the first five items
MAX_DROP_POINTS = 3.0  # DOMAIN §7: seed 003 rolls back at an accuracy drop > 3 % — in points (accuracy_veto)
# A reasoning model (the recipe names a reasoning parser, e.g. qwen3) thinks before it answers: the
# answer budgets below would end it mid-thought with an empty answer. Its items get this many more.
REASONING_BUDGET_TOKENS = 1024
# Words per prompt token budget: every filler word is ≥ 1 token in any tokenizer, most are 1–2, so
# 0.6 words per token keeps a prompt inside its token budget with room for the question.
WORDS_PER_TOKEN = 0.6
MIN_CONTEXT_WORDS = 60


class Kind(StrEnum):
    MULTIHOP_QA = "multihop_qa"
    SUMMARIZATION = "summarization"
    RETRIEVAL = "retrieval_multi_point"
    AGGREGATION = "keyword_aggregation"


class Item(BaseModel):
    kind: Kind
    index: int
    prompt: str
    answers: list[str]  # exact answers (QA, retrieval, aggregation) or the reference summary
    max_tokens: int


class ItemResult(BaseModel):
    kind: Kind
    index: int
    score: float = Field(ge=0, le=1)
    output: str = ""
    ok: bool = True
    error: str | None = None
    # What was scored: the answer ("content"), or the reasoning text when the content was empty
    # (a reasoning model cut off by its budget, or answering inside its thoughts).
    answered_in: str = "content"


class AccuracyResult(BaseModel):
    set_version: str = ACCURACY_SET_VERSION
    context_tokens: int
    items: list[ItemResult]

    def by_kind(self) -> dict[str, float]:
        """Mean score per kind, in points (0–100)."""
        out: dict[str, list[float]] = {}
        for r in self.items:
            out.setdefault(r.kind.value, []).append(r.score)
        return {k: 100.0 * sum(v) / len(v) for k, v in out.items()}

    @property
    def overall(self) -> float:
        kinds = self.by_kind()
        return sum(kinds.values()) / len(kinds) if kinds else 0.0

    def summary(self) -> dict[str, object]:
        return {
            "set_version": self.set_version,
            "context_tokens": self.context_tokens,
            "overall": round(self.overall, 2),
            "by_kind": {k: round(v, 2) for k, v in self.by_kind().items()},
            "items": len(self.items),
            "failed": sum(1 for r in self.items if not r.ok),
        }


# ---- generation

_NAMES = [
    "Alder", "Brook", "Cedar", "Dorian", "Elsa", "Faris", "Greta", "Hugo", "Ines", "Jonas", "Kira",
    "Luca", "Mira", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Soren", "Talia", "Umar", "Vera",
    "Wren", "Yara",
]
_OBJECTS = [
    "silver compass", "old map", "brass key", "red notebook", "glass lantern", "wooden flute",
    "blue umbrella", "copper kettle", "stone statue", "paper kite", "golden ring", "iron anchor",
]
_PLACES = [
    "north tower", "harbor office", "museum cellar", "river mill", "garden shed", "town library",
    "east station", "old bakery", "clock house", "market hall", "fire station", "glass house",
]
_CITIES = [
    "Lisbon", "Oslo", "Krakow", "Dublin", "Porto", "Geneva", "Tallinn", "Seville", "Bergen",
    "Ghent", "Verona", "Turku",
]
_KEYWORDS = [
    "apple", "tiger", "violet", "falcon", "marble", "rocket", "saffron", "walnut", "cobalt", "lotus",
    "pepper", "thistle", "quartz", "ember", "juniper", "magnet",
]
_FILLER = [
    "the", "weather", "stayed", "calm", "while", "people", "walked", "along", "quiet", "streets",
    "and", "talked", "about", "small", "things", "near", "a", "market", "where", "bread", "was",
    "sold", "every", "morning", "by", "friendly", "bakers", "who", "knew", "their", "neighbors",
]
_ROUTINE = [
    "The staff met for the weekly meeting and reviewed the calendar.",
    "Routine maintenance of the office printers was carried out as planned.",
    "Visitors signed in at the front desk and received their badges.",
    "The cleaning schedule was posted on the board in the hallway.",
    "Coffee supplies were restocked on Tuesday afternoon.",
    "The parking lot lights were checked and found to be working.",
]
_FINDINGS = [
    "The bridge inspection found cracks in two support beams.",
    "Water use in the city fell by twelve percent this year.",
    "The new library opened and served four thousand readers.",
    "Bus delays doubled during the winter months.",
    "The school budget was cut by five percent.",
    "Air quality improved after the factory closed.",
    "The hospital added forty beds to its emergency ward.",
    "Park visits rose sharply after the trails were repaired.",
    "The port handled a record number of ships in spring.",
    "Energy costs for public buildings rose by a third.",
]


class _Stream:
    """Deterministic choices from a sha256 counter stream (seed, kind, index)."""

    def __init__(self, seed: str) -> None:
        self._seed = seed
        self._counter = 0
        self._buf: list[int] = []

    def _byte(self) -> int:
        if not self._buf:
            digest = hashlib.sha256(f"{ACCURACY_SET_VERSION}:{self._seed}:{self._counter}".encode()).digest()
            self._buf = list(digest)
            self._counter += 1
        return self._buf.pop(0)

    def below(self, n: int) -> int:
        return (self._byte() * 256 + self._byte()) % n

    def pick(self, seq: Sequence[str]) -> str:
        return seq[self.below(len(seq))]

    def sample(self, seq: Sequence[str], k: int) -> list[str]:
        pool = list(seq)
        return [pool.pop(self.below(len(pool))) for _ in range(k)]

    def filler(self, words: int) -> list[str]:
        """Filler sentences of about `words` words."""
        out: list[str] = []
        n = 0
        while n < words:
            length = 8 + self.below(6)
            sentence = [self.pick(_FILLER) for _ in range(length)]
            out.append(" ".join(sentence).capitalize() + ".")
            n += length
        return out


def _insert(sentences: list[str], facts: list[str], rng: _Stream) -> list[str]:
    out = list(sentences)
    for fact in facts:
        out.insert(rng.below(len(out) + 1), fact)
    return out


def _multihop(rng: _Stream, index: int, words: int) -> Item:
    objects = rng.sample(_OBJECTS, 3)
    places = rng.sample(_PLACES, 3)
    cities = rng.sample(_CITIES, 3)
    facts = [f"The {o} is kept in the {p}." for o, p in zip(objects, places, strict=True)]
    facts += [f"The {p} is in the city of {c}." for p, c in zip(places, cities, strict=True)]
    passage = " ".join(_insert(rng.filler(max(words - 60, 20)), facts, rng))
    prompt = (
        f"Read the passage and answer the question with the city name only.\n\nPassage: {passage}\n\n"
        f"Question: In which city is the {objects[0]} kept?\nAnswer:"
    )
    return Item(kind=Kind.MULTIHOP_QA, index=index, prompt=prompt, answers=[cities[0]], max_tokens=16)


def _summary(rng: _Stream, index: int, words: int) -> Item:
    key = rng.sample(_FINDINGS, 3)
    routine_n = max(2, min(len(_ROUTINE), words // 12))
    routine = rng.sample(_ROUTINE, routine_n)
    report = " ".join(_insert(routine, key, rng))
    prompt = (
        "Summarise the key findings of this report in two or three sentences. Leave out routine "
        f"office matters.\n\nReport: {report}\n\nSummary:"
    )
    return Item(kind=Kind.SUMMARIZATION, index=index, prompt=prompt, answers=[" ".join(key)], max_tokens=96)


def _retrieval(rng: _Stream, index: int, words: int) -> Item:
    names = rng.sample(_NAMES, 6)
    codes = [str(1000 + rng.below(9000)) for _ in names]
    facts = [f"The secret code of {n} is {c}." for n, c in zip(names, codes, strict=True)]
    context = " ".join(_insert(rng.filler(max(words - 80, 40)), facts, rng))
    asked = [0, 2, 4]
    who = ", ".join(names[i] for i in asked)
    prompt = (
        f"Read the text and give the secret codes of {who}, in that order, as a list of numbers.\n\n"
        f"Text: {context}\n\nCodes of {who}:"
    )
    return Item(
        kind=Kind.RETRIEVAL, index=index, prompt=prompt, answers=[codes[i] for i in asked], max_tokens=32
    )


def _aggregation(rng: _Stream, index: int, words: int) -> Item:
    keywords = rng.sample(_KEYWORDS, 8)
    # Distinct counts: the top three clearly ahead of the rest, scaled to the context.
    entries = max(20, words // 9)
    top = [max(3, entries * 5 // 20), max(2, entries * 4 // 20), max(1, entries * 3 // 20)]
    rest = entries - sum(top)
    counts = dict(zip(keywords[:3], top, strict=True))
    for i in range(rest):
        kw = keywords[3 + i % 5]
        counts[kw] = counts.get(kw, 0) + 1
    bag = [kw for kw, n in counts.items() for _ in range(n)]
    order = [bag.pop(rng.below(len(bag))) for _ in range(len(bag))]
    lines = [
        f"Entry {k + 1}: {rng.pick(_FILLER)} {rng.pick(_FILLER)}, keyword {kw}." for k, kw in enumerate(order)
    ]
    # The rest never reaches the third count: a rest keyword has at most ceil(rest/5) entries.
    prompt = (
        "Below is a log of entries, each tagged with one keyword. Which three keywords occur most "
        "often? Answer with the three keywords only.\n\n" + "\n".join(lines) + "\n\nThe three most "
        "frequent keywords:"
    )
    return Item(kind=Kind.AGGREGATION, index=index, prompt=prompt, answers=keywords[:3], max_tokens=24)


def context_words(context_tokens: int) -> int:
    return max(MIN_CONTEXT_WORDS, int(context_tokens * WORDS_PER_TOKEN))


def build_set(
    short_context_tokens: int, long_context_tokens: int, n: int = ITEMS_PER_KIND, seed: str = "seed-0"
) -> list[Item]:
    """The four kinds, `n` items each. `short_context_tokens` sizes the passage kinds (QA,
    summarisation), `long_context_tokens` the long-context kinds (retrieval, aggregation)."""
    if n < 1:
        raise ValueError("at least one item per kind")
    makers = (
        (Kind.MULTIHOP_QA, _multihop, short_context_tokens),
        (Kind.SUMMARIZATION, _summary, short_context_tokens),
        (Kind.RETRIEVAL, _retrieval, long_context_tokens),
        (Kind.AGGREGATION, _aggregation, long_context_tokens),
    )
    items: list[Item] = []
    for kind, make, tokens in makers:
        for i in range(n):
            items.append(make(_Stream(f"{seed}:{kind.value}:{i}"), i, context_words(tokens)))
    return items


def set_digest(items: Sequence[Item]) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(item.model_dump_json().encode())
    return h.hexdigest()


# ---- scoring

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


@cache
def _rouge() -> Any:
    """Google's `rouge-score` (a dependency), imported when a summary is first scored: a host without
    it can still run everything else (`compare --no-accuracy`)."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def normalize(text: str) -> str:
    """SQuAD/HotpotQA answer normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalize(prediction).split(), normalize(reference).split()
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


_PUNCT_SPACE = str.maketrans(string.punctuation, " " * len(string.punctuation))


def _words(text: str) -> str:
    """Like `normalize`, but punctuation separates words: "1234,5678" holds 1234 and 5678."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT_SPACE)).split())


def _contains(output: str, answer: str) -> bool:
    """The answer as whole words of the output: "1234" is not in "12345"."""
    return f" {_words(answer)} " in f" {_words(output)} "


def scored_text(content: str, reasoning: str | None) -> tuple[str, str]:
    """What the model answered: the content, or the reasoning text when the content is empty (a
    reasoning parser put everything there). Returns (text, "content" | "reasoning")."""
    if content.strip() or not (reasoning or "").strip():
        return content, "content"
    return str(reasoning), "reasoning"


def score_item(item: Item, output: str) -> float:
    if item.kind is Kind.MULTIHOP_QA:
        return 1.0 if _contains(output, item.answers[0]) else token_f1(output, item.answers[0])
    if item.kind is Kind.SUMMARIZATION:
        return float(_rouge().score(item.answers[0], output)["rougeL"].fmeasure)
    found = sum(1 for a in item.answers if _contains(output, a))
    return found / len(item.answers)


class AccuracyDelta(BaseModel):
    baseline: dict[str, float]  # kind → points
    candidate: dict[str, float]
    drops: dict[str, float]  # kind → baseline − candidate, points
    overall_baseline: float
    overall_candidate: float
    flipped: list[dict[str, object]]  # items whose score moved, with both outputs


def compare_accuracy(baseline: AccuracyResult, candidate: AccuracyResult) -> AccuracyDelta:
    b_kinds, c_kinds = baseline.by_kind(), candidate.by_kind()
    drops = {k: b_kinds[k] - c_kinds.get(k, 0.0) for k in b_kinds}
    c_items = {(r.kind, r.index): r for r in candidate.items}
    flipped: list[dict[str, object]] = []
    for b in baseline.items:
        c = c_items.get((b.kind, b.index))
        if c is None or abs(c.score - b.score) > 1e-9:
            flipped.append(
                {
                    "kind": b.kind.value,
                    "index": b.index,
                    "baseline_score": round(b.score, 4),
                    "candidate_score": None if c is None else round(c.score, 4),
                    "baseline_output": b.output,
                    "candidate_output": None if c is None else c.output,
                }
            )
    return AccuracyDelta(
        baseline=b_kinds,
        candidate=c_kinds,
        drops=drops,
        overall_baseline=baseline.overall,
        overall_candidate=candidate.overall,
        flipped=flipped,
    )
