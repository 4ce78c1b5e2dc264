"""llama.cpp's own JSON-schema converter (common's ``json_schema_to_grammar``, the one behind llama-server's
``response_format``), reached through ``llama_moe_json_schema_to_grammar``: a C entry point the patch series adds
to libllama-common, which the build installs beside libllama and names in the manifest (``common_library``)."""
from __future__ import annotations

import threading
from typing import Any

from . import loader
from .ffi import ffi
from ..errors import NativeLibraryError, ParameterError

COMMON_LIBRARY = "libllama-common.so"  # for a library without a manifest ($LLAMA_MOE_LIB)
_ERR_SIZE = 2048

_lock = threading.Lock()
_common: Any = None


def common_library() -> Any:
    """libllama-common of the loaded libllama's build, loaded on first use."""
    global _common
    loader.get_lib()  # libllama first: libllama-common links it, and the manifest sits beside it
    with _lock:
        if _common is not None:
            return _common
        path = loader.library_path()
        assert path is not None
        path = path.parent / loader.manifest().get("common_library", COMMON_LIBRARY)
        if not path.is_file():
            raise NativeLibraryError(f"{path} is missing: JSON schemas are converted by llama.cpp's converter in "
                                     f"libllama-common; rebuild with 'python -m llama_moe build'")
        try:
            common = ffi.dlopen(str(path))
            common.llama_moe_json_schema_to_grammar  # noqa: B018 (a build of older patches lacks it)
        except (OSError, AttributeError) as exc:
            raise NativeLibraryError(f"{path}: no JSON-schema converter ({exc}); rebuild with "
                                     f"'python -m llama_moe build'") from exc
        _common = common
        return common


def schema_to_grammar(schema_json: str) -> str:
    """The GBNF grammar of a JSON schema given as JSON text; ParameterError with the converter's reason when it
    refuses the schema."""
    common = common_library()
    text = schema_json.encode("utf-8")
    err = ffi.new("char[]", _ERR_SIZE)
    n = int(common.llama_moe_json_schema_to_grammar(text, ffi.NULL, 0, err, _ERR_SIZE))
    if n >= 0:
        buf = ffi.new("char[]", n + 1)
        n = int(common.llama_moe_json_schema_to_grammar(text, buf, n + 1, err, _ERR_SIZE))
    if n < 0:
        said = ffi.string(err).decode("utf-8", "replace").splitlines()
        # the converter heads its reasons with one or two "JSON schema conversion failed:" lines
        reason = "; ".join(s.strip() for s in said if s.strip() and s.strip() != "JSON schema conversion failed:")
        raise ParameterError(f"llama.cpp's JSON-schema converter refuses the schema: {reason}")
    return ffi.buffer(buf, n)[:].decode("utf-8")
