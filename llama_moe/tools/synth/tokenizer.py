"""A byte-level BPE tokenizer (GPT-2 style, Qwen2 pre-tokenizer) with its own small trainer.

llama.cpp loads it as ``tokenizer.ggml.model = "gpt2"`` with ``tokenizer.ggml.pre = "qwen2"``.
"qwen2" is chosen because llama.cpp sets ``clean_spaces = false`` for it, so detokenizing gives
back the exact text (the "default"/"gpt-2" pre-tokenizers strip spaces before punctuation).

Our Python encoder mirrors llama.cpp's: split with the Qwen2 regex, map bytes to printable
characters, then apply merges lowest rank first. Python's ``re`` has no ``\\p{L}``; letters are
written as ``[^\\W\\d_]`` and numbers as ``\\d``, which is exact for ASCII and for ordinary
letters/digits of other scripts (rare numeric symbols such as "²" may split differently).
"""
from __future__ import annotations

import heapq
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_moe.errors import LlamaMoeError

# llama.cpp token types (include/llama.h, enum llama_token_type)
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_UNUSED = 5

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML, the format Qwen models use; llama.cpp also recognises it by "<|im_start|>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2's pre-tokenizer regex, with \p{L} -> [^\W\d_] and \p{N} -> \d (see module docstring).
_L = r"[^\W\d_]"
_NOT_LN = r"(?:[^\r\n\w]|_)"  # [^\r\n\p{L}\p{N}]
_PUNCT = r"(?:[^\s\w]|_)"  # [^\s\p{L}\p{N}]
PRETOKENIZE_RE = re.compile(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    rf"|{_NOT_LN}?{_L}+"
    r"|\d"
    rf"| ?{_PUNCT}+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def _bytes_to_unicode() -> dict[int, str]:
    """Map every byte to a printable character: printable Latin-1 bytes map to themselves,
    the others (controls, space, ...) to code points from 256 up, in byte order."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def pretokenize(text: str) -> list[str]:
    return PRETOKENIZE_RE.findall(text)


def byte_encode(word: str) -> str:
    return "".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8"))


def train_bpe(texts: Iterable[str], n_merges: int, min_count: int = 2) -> list[tuple[str, str]]:
    """Learn up to ``n_merges`` merges (most frequent pair first, ties by the pair's text so the
    result is deterministic); stops early when no pair occurs ``min_count`` times."""
    word_freq: Counter[str] = Counter()
    for text in texts:
        word_freq.update(byte_encode(w) for w in pretokenize(text))
    words = [list(w) for w in sorted(word_freq)]
    freqs = [word_freq[w] for w in sorted(word_freq)]

    pair_count: defaultdict[tuple[str, str], int] = defaultdict(int)
    where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for i, syms in enumerate(words):
        for a, b in zip(syms, syms[1:]):
            pair_count[(a, b)] += freqs[i]
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    merges: list[tuple[str, str]] = []
    while heap and len(merges) < n_merges:
        negc, pair = heapq.heappop(heap)
        if -negc != pair_count.get(pair, 0):
            continue  # stale heap entry
        if -negc < min_count:
            break
        merges.append(pair)
        a, b = pair
        merged = a + b
        touched: dict[tuple[str, str], None] = {}
        for i in sorted(where.pop(pair, ())):
            syms, f = words[i], freqs[i]
            for x, y in zip(syms, syms[1:]):
                pair_count[(x, y)] -= f
                touched[(x, y)] = None
            out: list[str] = []
            j = 0
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            words[i] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += f
                where[(x, y)].add(i)
                touched[(x, y)] = None
        for p in touched:
            c = pair_count.get(p, 0)
            if c <= 0:
                pair_count.pop(p, None)
            else:
                heapq.heappush(heap, (-c, p))
        pair_count.pop(pair, None)
    return merges


@dataclass(frozen=True)
class BpeTokenizer:
    """Vocabulary: 256 byte tokens, one token per merge, the special tokens, then padding."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[tuple[str, str], ...]
    _words: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)
    _memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def build(merges: Sequence[tuple[str, str]], n_vocab: int | None = None) -> BpeTokenizer:
        tokens = [BYTE_TO_CHAR[b] for b in range(256)] + [a + b for a, b in merges]
        if len(set(tokens)) != len(tokens):
            raise LlamaMoeError("BPE merges produced a duplicate token")
        types = [TOKEN_NORMAL] * len(tokens)
        tokens += list(SPECIAL_TOKENS)
        types += [TOKEN_CONTROL] * len(SPECIAL_TOKENS)
        if n_vocab is not None:
            if n_vocab < len(tokens):
                raise LlamaMoeError(f"n_vocab {n_vocab} is smaller than the {len(tokens)} real tokens")
            # unique names: llama.cpp asserts every token text is distinct
            tokens += [f"[PAD{i}]" for i in range(len(tokens), n_vocab)]
            types += [TOKEN_UNUSED] * (n_vocab - len(types))
        return BpeTokenizer(tuple(tokens), tuple(types), tuple(merges))

    # --- vocabulary facts -------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def n_real(self) -> int:
        """Tokens that are not padding (bytes, merges and special tokens)."""
        return sum(1 for t in self.token_types if t != TOKEN_UNUSED)

    def token_id(self, text: str) -> int:
        return self._index()[text]

    @property
    def bos_id(self) -> int:
        return self.token_id(ENDOFTEXT)

    @property
    def eos_id(self) -> int:
        return self.token_id(IM_END)

    def merge_strings(self) -> list[str]:
        return [f"{a} {b}" for a, b in self.merges]

    def _index(self) -> dict[str, int]:
        if "index" not in self._memo:
            self._memo["index"] = {t: i for i, t in enumerate(self.tokens)}
        return self._memo["index"]

    def _ranks(self) -> dict[tuple[str, str], int]:
        if "ranks" not in self._memo:
            self._memo["ranks"] = {p: i for i, p in enumerate(self.merges)}
        return self._memo["ranks"]

    # --- encode / decode --------------------------------------------------------------------

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Token ids of ``text`` (no BOS added, as llama.cpp does for this vocabulary)."""
        if not allow_special:
            return self._encode_plain(text)
        ids: list[int] = []
        pattern = "(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")"
        for part in re.split(pattern, text):
            if part in SPECIAL_TOKENS:
                ids.append(self.token_id(part))
            elif part:
                ids.extend(self._encode_plain(part))
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        index = self._index()
        out: list[int] = []
        ranks = self._ranks()
        for word in pretokenize(text):
            pieces = self._words.get(word)
            if pieces is None:
                pieces = _bpe_word(byte_encode(word), ranks)
                if len(self._words) < 65536:  # memo of frequent words; bounded
                    self._words[word] = pieces
            out.extend(index[p] for p in pieces)
        return out

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of ``ids``; control tokens only when ``special``, padding never (as llama.cpp)."""
        buf = bytearray()
        for i in ids:
            t = self.token_types[i]
            if t == TOKEN_NORMAL:
                buf.extend(CHAR_TO_BYTE[c] for c in self.tokens[i])
            elif t == TOKEN_CONTROL and special:
                buf.extend(self.tokens[i].encode())
        return buf.decode("utf-8", errors="replace")


def _bpe_word(word: str, ranks: dict[tuple[str, str], int]) -> tuple[str, ...]:
    """Apply merges lowest rank first; among equal ranks the leftmost pair, as llama.cpp does."""
    syms = list(word)
    while len(syms) > 1:
        best = -1
        best_rank = len(ranks)
        for j in range(len(syms) - 1):
            r = ranks.get((syms[j], syms[j + 1]))
            if r is not None and r < best_rank:
                best, best_rank = j, r
        if best < 0:
            break
        syms[best : best + 2] = [syms[best] + syms[best + 1]]
    return tuple(syms)
