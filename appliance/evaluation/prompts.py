"""The committed, versioned prompt sets. Pure and deterministic: no download at run time.

Benchmark prompts are generated from a fixed word list by a sha256 counter stream (not `random`,
whose algorithms may change between Python versions), so request i of tier t is the same text on
every host and every run (DOMAIN §7: "fixed first five requests"). The bench trims each prompt to
its exact input length with the engine's own tokenizer (`/tokenize`), so the same text serves any
model. `PROMPT_SET_SHA256` pins the generator's output: a change to it must bump the version
(tests/unit/test_prompts.py recomputes it).
"""

from __future__ import annotations

import hashlib

PROMPT_SET_VERSION = "ps-v1"

_WORDS = [
    "river",
    "mountain",
    "window",
    "garden",
    "letter",
    "market",
    "winter",
    "summer",
    "station",
    "bridge",
    "forest",
    "engine",
    "paper",
    "signal",
    "harbor",
    "valley",
    "orange",
    "silver",
    "copper",
    "morning",
    "evening",
    "number",
    "planet",
    "circle",
    "square",
    "music",
    "doctor",
    "teacher",
    "farmer",
    "sailor",
    "pilot",
    "kitchen",
    "village",
    "castle",
    "island",
    "desert",
    "ocean",
    "cloud",
    "thunder",
    "lantern",
    "candle",
    "basket",
    "ladder",
    "pencil",
    "rocket",
    "camera",
    "mirror",
    "bottle",
    "carpet",
    "blanket",
    "jacket",
    "pocket",
    "wheel",
    "hammer",
    "needle",
    "button",
    "marble",
    "feather",
    "shadow",
    "meadow",
    "harvest",
    "journey",
]

# What each benchmark prompt asks: a task that produces long outputs from long inputs.
_HEADER = "Below is a list of notes. Rewrite every note as a full sentence, in order.\nNotes:\n"

# Fixed prompts for the reproducibility fingerprint (short: the point is the token stream).
FINGERPRINT_PROMPTS: tuple[str, ...] = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "List ten animals that live in the ocean.",
    "Describe the water cycle in simple words.",
    "Write a letter to a friend about a trip to the mountains.",
    "What happens when you mix red and blue paint?",
    "Give step by step instructions to make tea.",
    "Tell me about the history of the printing press.",
)


def _word_stream(seed: str, count: int) -> list[str]:
    out: list[str] = []
    counter = 0
    while len(out) < count:
        digest = hashlib.sha256(f"{PROMPT_SET_VERSION}:{seed}:{counter}".encode()).digest()
        out.extend(_WORDS[b % len(_WORDS)] for b in digest)
        counter += 1
    return out[:count]


def bench_prompt(tier: str, index: int, min_words: int) -> str:
    """Request `index` of tier `tier`: at least `min_words` words (each is ≥ 1 token in any
    tokenizer), so trimming to the target token count always has enough text."""
    words = _word_stream(f"{tier}:{index}", max(min_words, 1))
    lines = [" ".join(words[i : i + 8]) + "." for i in range(0, len(words), 8)]
    return _HEADER + "\n".join(f"{n + 1}. {line}" for n, line in enumerate(lines))


def prompt_set_digest(
    tiers: tuple[str, ...] = ("4-8K", "8-16K", "16-32K"), n: int = 5, words: int = 64
) -> str:
    """sha256 over a fixed sample of the generator's output (what `PROMPT_SET_SHA256` pins)."""
    h = hashlib.sha256()
    for tier in tiers:
        for i in range(n):
            h.update(bench_prompt(tier, i, words).encode())
    for p in FINGERPRINT_PROMPTS:
        h.update(p.encode())
    return h.hexdigest()


PROMPT_SET_SHA256 = "cca1b42056e29831869b91bc8fbcdd6acd7b57e84d40ddeb25fe66a867306914"
