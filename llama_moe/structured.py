"""Structured output: answers held to a GBNF grammar by llama.cpp's own grammar sampler
(``llama_sampler_init_grammar``), and JSON answers (``response_format``) through llama.cpp's own JSON-schema
converter, the one llama-server's ``response_format`` uses (see ``_native.json_schema``).

Everything here is checked before a token is evaluated: a grammar llama.cpp's parser refuses, a schema its converter
refuses, a ``response_format`` of an unknown type, or a grammar together with a ``response_format`` is a
ParameterError with the reason.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ._native import check as _check
from ._native.ffi import ffi
from ._native.json_schema import schema_to_grammar
from .errors import ParameterError

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
GRAMMAR_ROOT = "root"  # the start symbol llama.cpp's grammars and the converter's name


def json_schema_to_grammar(schema: Mapping[str, Any] | bool | str) -> str:
    """The GBNF grammar of a JSON schema (a mapping, ``True``, or its JSON text), made by llama.cpp's converter."""
    if isinstance(schema, str):
        text = schema
    else:
        if not isinstance(schema, (Mapping, bool)):
            raise ParameterError(f"a JSON schema must be a mapping (or its JSON text), got {type(schema).__name__}")
        try:
            text = json.dumps(schema)
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"the JSON schema is not JSON: {exc}") from None
    if "\0" in text:
        raise ParameterError("the JSON schema contains a NUL character")
    return schema_to_grammar(text)


def _schema_of(response_format: Mapping[str, Any]) -> Any:
    """The schema of a json_schema response_format: ``schema`` at the top, or OpenAI's ``json_schema.schema``."""
    if "schema" in response_format:
        return response_format["schema"]
    nested = response_format.get("json_schema")
    if isinstance(nested, Mapping) and "schema" in nested:
        return nested["schema"]
    raise ParameterError("response_format of type 'json_schema' needs a schema: {'type': 'json_schema', 'schema': "
                         "{...}} or OpenAI's {'type': 'json_schema', 'json_schema': {'schema': {...}}}")


def response_format_grammar(response_format: Mapping[str, Any]) -> str | None:
    """The grammar an OpenAI-style ``response_format`` asks for: None for ``text``, any JSON object for
    ``json_object`` (or its ``schema``, as llama-server takes it), the schema's language for ``json_schema``."""
    if not isinstance(response_format, Mapping):
        raise ParameterError(f"response_format must be a mapping such as {{'type': 'json_object'}}, got "
                             f"{type(response_format).__name__}")
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise ParameterError(f"response_format: type must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_to_grammar(response_format.get("schema", {"type": "object"}))
    return json_schema_to_grammar(_schema_of(response_format))


def resolve_grammar(grammar: str | None, response_format: Mapping[str, Any] | None) -> str | None:
    """The one grammar a call is held to: its ``grammar``, or its ``response_format``'s, or None."""
    if grammar is not None and response_format is not None:
        raise ParameterError("give grammar or response_format, not both: each is a grammar of its own")
    if response_format is not None:
        return response_format_grammar(response_format)
    return check_grammar_text(grammar)


def check_grammar_text(grammar: Any) -> str | None:
    """``grammar`` as llama_sampler_init_grammar takes it (GBNF text, or None for no grammar)."""
    if grammar is None:
        return None
    if not isinstance(grammar, str):
        raise ParameterError(f"grammar must be GBNF text (a str) or None, got {type(grammar).__name__}")
    if not grammar.strip():
        raise ParameterError("grammar is empty: give GBNF rules with a 'root' rule, or None for no grammar")
    if "\0" in grammar:
        raise ParameterError("grammar contains a NUL character")
    return grammar


def grammar_sampler(lib: Any, vocab: Any, grammar: str) -> Any:
    """llama.cpp's grammar sampler over the model's vocabulary; ParameterError with the parser's reason when
    llama.cpp refuses the grammar (it returns NULL and says why in its log)."""
    _check.begin()
    smpl = lib.llama_sampler_init_grammar(vocab.ptr, grammar.encode("utf-8"), GRAMMAR_ROOT.encode())
    if smpl == ffi.NULL:
        said = _check.said()
        specific = [p for p in said.split("; ") if p and p != "failed to parse grammar"]
        reason = "; ".join(specific) or said or "no reason given"
        raise ParameterError(f"llama.cpp's grammar parser refuses the grammar: {reason}")
    return smpl
