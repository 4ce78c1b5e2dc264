"""A model's vocabulary: tokenization and token pieces, over the ``llama_vocab`` pointer that lives inside the
model's memory. It checks nothing about lifetimes: ``Model`` calls it while open, and ``Context`` while the
context is open (a context holds its model's memory, so the vocabulary outlives ``model.close()``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ModelLoadError, ParameterError
from .ffi import ffi


@dataclass(frozen=True)
class Vocab:
    lib: Any
    ptr: Any  # const struct llama_vocab *

    @property
    def n_tokens(self) -> int:
        return int(self.lib.llama_vocab_n_tokens(self.ptr))

    @property
    def bos(self) -> int:
        return int(self.lib.llama_vocab_bos(self.ptr))

    @property
    def eos(self) -> int:
        return int(self.lib.llama_vocab_eos(self.ptr))

    def is_eog(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_eog(self.ptr, token))

    def check_token(self, token: int) -> None:
        n = self.n_tokens
        if not 0 <= token < n:
            raise ParameterError(f"token id {token} is outside the vocabulary (0..{n - 1})")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            out = ffi.new("llama_token[]", capacity)
            n = self.lib.llama_tokenize(self.ptr, data, len(data), out, capacity, add_special, parse_special)
            if n >= 0:
                return list(out[0:n])
            if n == -(2**31):
                raise ModelLoadError("tokenize: the text is too long for llama.cpp's int32 token count")
            capacity = -n

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        self.check_token(token)
        buf = ffi.new("char[]", 64)
        n = self.lib.llama_token_to_piece(self.ptr, token, buf, 64, 0, special)
        if n < 0:
            buf = ffi.new("char[]", -n)
            n = self.lib.llama_token_to_piece(self.ptr, token, buf, -n, 0, special)
        return ffi.buffer(buf, n)[:]

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        for t in tokens:
            self.check_token(t)
        arr = ffi.new("llama_token[]", list(tokens))
        capacity = max(16, 8 * len(tokens))
        while True:
            buf = ffi.new("char[]", capacity)
            n = self.lib.llama_detokenize(self.ptr, arr, len(tokens), buf, capacity, remove_special, unparse_special)
            if n >= 0:
                return ffi.buffer(buf, n)[:].decode("utf-8", "replace")
            capacity = -n
