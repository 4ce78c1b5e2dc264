"""A loaded model: its geometry, its vocabulary, and tokenization."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ._native import check as _check
from ._native.ffi import ffi
from ._native.handle import NativeHandle
from ._native.loader import get_lib
from ._native.vocab import Vocab
from .errors import GgufError, ModelLoadError
from .params import ModelParams


@dataclass(frozen=True)
class MoeGeometry:
    """The MoE shape of a model as its GGUF states it (zeros for a dense model)."""

    n_layer: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int


def _check_gguf(path: Path) -> tuple[MoeGeometry, int]:
    """Reads the GGUF header before llama.cpp does, so a corrupt or truncated file gets an error that says what
    is wrong (the reader checks that every tensor's data lies inside the file). Returns the geometry and the
    byte where the tensor data ends."""
    from .gguf_files.reader import read_gguf

    try:
        gguf = read_gguf(path)
    except GgufError as exc:
        raise ModelLoadError(str(exc)) from exc
    data_end = max((t.offset + t.nbytes for t in gguf.tensors), default=0)
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{path}: no general.architecture in the GGUF metadata; is it a llama.cpp model?")

    def meta_int(key: str) -> int:
        value = gguf.metadata.get(f"{arch}.{key}", 0)
        return int(value) if isinstance(value, (int, float)) else 0

    return MoeGeometry(meta_int("block_count"), meta_int("expert_count"), meta_int("expert_used_count"),
                       meta_int("expert_feed_forward_length")), data_end


class Model(NativeHandle):
    """A GGUF model loaded by the patched libllama. Close it (or use ``with``) to free its memory.

    Its contexts keep its memory: ``close()`` while a context is open closes the model (its own methods raise
    ``ClosedError``) but frees its weights only when the last of its contexts is closed, so the contexts keep
    working. A context cannot be made on a closed model."""

    _kind = "Model"

    def __init__(self, path: str | os.PathLike[str], params: ModelParams | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.params = params or ModelParams()
        self.params.validate()  # before the file is read: a bad parameter is the first thing said
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: no such model file")
        self.geometry, self._data_end = _check_gguf(self.path)
        lib = get_lib()
        native, keep = self.params._to_native(lib, self.geometry.n_layer or None)
        _check.begin()
        ptr = lib.llama_model_load_from_file(str(self.path).encode(), native)
        del keep  # the loader copied what it needs
        if ptr == ffi.NULL:
            raise ModelLoadError(f"{self.path}: llama.cpp could not load it: {_check.said('no reason given')}")
        self._lib = lib
        self._adopt(ptr, lambda p=ptr, l=lib: l.llama_model_free(p))
        self._vocab = Vocab(lib, lib.llama_model_get_vocab(ptr))
        try:
            self.check_file()
        except ModelLoadError:
            self.close()
            raise

    def check_file(self) -> None:
        """Raises ModelLoadError if the model file is now shorter than its tensor data. llama.cpp checks the size
        when it opens the file; a file truncated after that loads without error when memory-mapped (use_mmap)
        and kills the process with SIGBUS when the missing pages are first read. Called after the load and
        when a context is created; a truncation after those stays fatal with mmap (use_mmap=False reads the
        weights into memory: a truncation during the load is then a read error, and the file no longer matters
        once loaded). A file replaced by a shorter one under the same name is refused too."""
        if not self.params.use_mmap:
            return
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return  # deleted: a mapping keeps the deleted file's pages
        if size < self._data_end:
            raise ModelLoadError(
                f"{self.path}: the file has {size} bytes but its tensor data ends at byte {self._data_end}: it was "
                f"truncated (or replaced by a shorter file) after llama.cpp opened it. Its weights are memory-mapped "
                f"(use_mmap=True), and reading the missing pages would kill the process with SIGBUS; load it again "
                f"from a complete file")

    # -- geometry -------------------------------------------------------------------------------------
    # Each call holds the model's memory while it runs (_using): a close() from another thread waits for it.
    @property
    def n_layer(self) -> int:
        with self._using() as ptr:
            return int(self._lib.llama_model_n_layer(ptr))

    @property
    def n_embd(self) -> int:
        with self._using() as ptr:
            return int(self._lib.llama_model_n_embd(ptr))

    @property
    def n_vocab(self) -> int:
        with self._using():
            return self._vocab.n_tokens

    @property
    def n_params(self) -> int:
        with self._using() as ptr:
            return int(self._lib.llama_model_n_params(ptr))

    @property
    def size_bytes(self) -> int:
        with self._using() as ptr:
            return int(self._lib.llama_model_size(ptr))

    @property
    def description(self) -> str:
        buf = ffi.new("char[]", 256)
        with self._using() as ptr:
            self._lib.llama_model_desc(ptr, buf, 256)
        return ffi.string(buf).decode("utf-8", "replace")

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as llama.cpp renders it, or None when the key is absent."""
        size = 256
        with self._using() as ptr:
            while True:
                buf = ffi.new("char[]", size)
                n = self._lib.llama_model_meta_val_str(ptr, key.encode(), buf, size)
                if n < 0:
                    return None
                if n < size:
                    return ffi.string(buf).decode("utf-8", "replace")
                size = n + 1

    # -- vocabulary -----------------------------------------------------------------------------------
    @property
    def bos(self) -> int:
        with self._using():
            return self._vocab.bos

    @property
    def eos(self) -> int:
        with self._using():
            return self._vocab.eos

    def is_eog(self, token: int) -> bool:
        with self._using():
            return self._vocab.is_eog(token)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        with self._using():
            return self._vocab.tokenize(text, add_special, parse_special)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token; a multi-byte character can be split across tokens."""
        with self._using():
            return self._vocab.token_to_piece(token, special)

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        with self._using():
            return self._vocab.detokenize(tokens, remove_special, unparse_special)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.geometry.n_layer} layers, {self.geometry.n_expert} experts"
        return f"<Model {self.path.name}: {state}>"

    @property
    def _native(self) -> Any:
        return self._live()
