"""The embedded English corpus: original prose on eight topics, split into paragraphs.

It trains the tokenizer and the bigram language model of the synthetic models, and its
paragraphs serve as benchmark prompts with a fixed train/test split (every third paragraph
of each topic is held out), so that profiles built on train text are scored on unseen text.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

TOPICS = ("astronomy", "cooking", "gardening", "history", "medicine", "music", "sailing", "software")


def load_corpus() -> dict[str, str]:
    """Topic name -> full text (paragraphs separated by blank lines), in TOPICS order."""
    root = resources.files("llama_moe.tools.synth") / "corpus"
    return {t: (root / f"{t}.txt").read_text(encoding="utf-8").strip() + "\n" for t in TOPICS}


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


@dataclass(frozen=True)
class CorpusSplit:
    """Paragraphs per topic; ``train`` and ``test`` never share a paragraph."""

    train: dict[str, list[str]]
    test: dict[str, list[str]]

    def train_paragraphs(self) -> list[str]:
        return [p for ps in self.train.values() for p in ps]

    def test_paragraphs(self) -> list[str]:
        return [p for ps in self.test.values() for p in ps]


def split_paragraphs(corpus: dict[str, str] | None = None, test_every: int = 3, offset: int = 2) -> CorpusSplit:
    """Hold out paragraph i of each topic when ``i % test_every == offset`` (default: every third
    paragraph, starting with the third), so both splits cover every topic."""
    if test_every < 2 or not 0 <= offset < test_every:
        raise ValueError(f"need test_every >= 2 and 0 <= offset < test_every, got {test_every}, {offset}")
    corpus = load_corpus() if corpus is None else corpus
    train: dict[str, list[str]] = {}
    test: dict[str, list[str]] = {}
    for topic, text in corpus.items():
        ps = paragraphs(text)
        train[topic] = [p for i, p in enumerate(ps) if i % test_every != offset]
        test[topic] = [p for i, p in enumerate(ps) if i % test_every == offset]
    return CorpusSplit(train, test)
