"""Structured output on the real patched libllama and the tiny synthetic model: answers held to a JSON schema
(llama.cpp's own converter, reached through libllama-common) validate against it, json_object answers parse, a GBNF
grammar holds generate, chat and every sequence of a batch (each with its own grammar state) to its language, with
the MoE cache on as well; every malformed grammar, schema or response_format is a ParameterError with the reason,
raised before anything is evaluated. The llama-cpp-python-shaped front answers in OpenAI's shapes."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import llama_moe
from llama_moe import Context, ContextParams, Llama, Model, ModelParams, ParameterError, Sampling, \
    json_schema_to_grammar
from llama_moe.batch import generate_batch, stream_batch
from llama_moe.chat import ChatStream, chat
from support.cache_sizes import mib_for_slots

# every part bounded (enums, bounded integers, maxItems, no other properties), so the random tiny model must finish
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": -5, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "yz"]}, "maxItems": 3},
        "size": {"type": "object", "properties": {"w": {"type": "integer", "minimum": 1, "maximum": 9}},
                 "required": ["w"], "additionalProperties": False},
    },
    "required": ["colour", "count", "tags", "size"],
    "additionalProperties": False,
}
YES_NO = 'root ::= ("yes" | "no")'
CONVERSATION = [{"role": "user", "content": "Describe the ship as JSON."}]
PROMPTS = ["The ship left the harbour at dawn, and the crew", "To grow tomatoes in a small garden, start with",
           "The history of the city", "In the morning the baker"]
RAM = ModelParams(cpu_moe=True, repack=False)


@pytest.fixture(scope="module")
def model(lib, tiny_model_path):
    with Model(tiny_model_path, RAM) as m:
        yield m


@pytest.fixture()
def ctx(model):
    with Context(model, ContextParams(n_ctx=1024, n_threads=2, n_seq_max=4)) as c:
        yield c


def _sampled(seed: int) -> Sampling:
    return Sampling(temperature=1.0, top_k=0, top_p=1.0, seed=seed)


def test_schemas_go_through_llama_cpps_converter_in_libllama_common(lib) -> None:
    grammar = json_schema_to_grammar(SCHEMA)
    assert re.search(r"^root ::= ", grammar, re.M) and '"\\"red\\""' in grammar
    assert json_schema_to_grammar(json.dumps(SCHEMA)) == grammar  # the JSON text as well
    info = llama_moe.native_version()
    common = Path(info["path"]).parent / info["common_library"]
    assert common.is_file()
    nm = shutil.which("nm")
    if nm is not None:
        out = subprocess.run([nm, "-D", "--defined-only", str(common)], capture_output=True, text=True, check=True)
        assert re.search(r"\bT llama_moe_json_schema_to_grammar$", out.stdout, re.M)


def test_the_installed_package_converts_from_a_built_cache_alone(lib, tmp_path: Path) -> None:
    """The package as the wheel lays it out (patches in llama_moe/_patches), outside any checkout, finds the build
    in the cache and its converter through the manifest."""
    root = Path(llama_moe.__file__).resolve().parents[1]
    site = tmp_path / "site"
    shutil.copytree(root / "llama_moe", site / "llama_moe", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "patches", site / "llama_moe" / "_patches")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LLAMA_MOE_LIB")}
    env["PYTHONPATH"] = str(site)
    code = ("import json, llama_moe; print(llama_moe.__file__); "
            "print(json.dumps(llama_moe.json_schema_to_grammar({'enum': ['a', 'b']})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    where, grammar = proc.stdout.splitlines()
    assert where.startswith(str(site))
    assert json.loads(grammar) == json_schema_to_grammar({"enum": ["a", "b"]})


@pytest.mark.slow
def test_json_schema_answers_validate_against_the_schema(ctx) -> None:
    texts = []
    for seed in range(20):
        res = chat(ctx, CONVERSATION, 400, _sampled(seed), response_format={"type": "json_schema", "schema": SCHEMA})
        assert res.finish_reason == "stop", (seed, res.text)
        jsonschema.validate(json.loads(res.text), SCHEMA)
        texts.append(res.text)
    assert len(set(texts)) > 10  # sampled, not one answer
    # OpenAI's nested form is the same schema: the same grammar, so the same answer for the same seed
    nested = {"type": "json_schema", "json_schema": {"name": "ship", "strict": True, "schema": SCHEMA}}
    assert chat(ctx, CONVERSATION, 400, _sampled(3), response_format=nested).text == texts[3]
    # without the schema the model writes no JSON
    free = chat(ctx, CONVERSATION, 60, _sampled(0)).text
    with pytest.raises(ValueError):
        json.loads(free)


def test_json_object_answers_parse_as_objects(ctx) -> None:
    for seed in range(6):
        res = chat(ctx, CONVERSATION, 600, _sampled(seed), response_format={"type": "json_object"})
        assert res.finish_reason == "stop", (seed, res.text)
        assert isinstance(json.loads(res.text), dict)
    # a json_object's schema, as llama-server takes it
    res = chat(ctx, CONVERSATION, 400, _sampled(0), response_format={"type": "json_object", "schema": SCHEMA})
    jsonschema.validate(json.loads(res.text), SCHEMA)
    # "text" asks for nothing: the same answer as no response_format
    assert chat(ctx, CONVERSATION, 30, _sampled(1), response_format={"type": "text"}).text == \
        chat(ctx, CONVERSATION, 30, _sampled(1)).text


def test_chat_stream_is_held_to_the_schema(ctx) -> None:
    stream = ChatStream(ctx, CONVERSATION, 400, _sampled(7), response_format={"type": "json_schema", "schema": SCHEMA})
    pieces = list(stream)
    assert stream.result is not None and "".join(pieces) == stream.result.text
    jsonschema.validate(json.loads(stream.result.text), SCHEMA)


def test_a_grammar_holds_generate_and_complete_to_its_language(ctx, model) -> None:
    answers = set()
    for seed in range(12):
        tokens = list(ctx.generate(PROMPTS[0], 16, _sampled(seed), grammar=YES_NO))
        text = model.detokenize(tokens)
        assert text in ("yes", "no"), (seed, text)
        answers.add(text)
        ctx.reset()
    assert answers == {"yes", "no"}
    assert ctx.complete(PROMPTS[1], 16, grammar=YES_NO).text in ("yes", "no")  # greedy
    ctx.reset()
    digits = ctx.complete(PROMPTS[2], 16, _sampled(5), grammar="root ::= [0-9]{3} \"!\"")
    assert re.fullmatch(r"[0-9]{3}!", digits.text) and digits.stopped_by == "eog"
    ctx.reset()
    # the same prompt without a grammar says something else
    assert ctx.complete(PROMPTS[0], 16, _sampled(0)).text not in ("yes", "no")


def test_each_sequence_of_a_batch_has_its_own_grammar(ctx) -> None:
    samplings = [_sampled(s) for s in range(4)]
    res = generate_batch(ctx, PROMPTS, 24, samplings, grammar=YES_NO)
    assert all(t in ("yes", "no") for t in res.texts), res.texts
    # a grammar per prompt (one without): each sequence's answer is in its own language, while the steps interleave
    grammars = ['root ::= "maybe"', None, 'root ::= [0-9]{2} ("a" | "b")', YES_NO]
    res = generate_batch(ctx, PROMPTS, [12, 12, 12, 12], samplings, grammar=grammars)
    assert res.texts[0] == "maybe"
    assert re.fullmatch(r"[0-9]{2}[ab]", res.texts[2]) and res.texts[3] in ("yes", "no")
    assert len(res.completions[1].tokens) == 12 and res.completions[1].stopped_by == "length"
    # streamed: the same tokens
    pairs = list(stream_batch(ctx, PROMPTS, [12, 12, 12, 12], samplings, grammar=grammars))
    assert [[t for i, t in pairs if i == k] for k in range(4)] == [list(c.tokens) for c in res.completions]


def test_with_the_moe_cache_on_the_answers_are_the_same(model, tiny_model_path, monkeypatch) -> None:
    params = ContextParams(moe_cache_device="CPU", n_ctx=1024, n_threads=2, n_seq_max=4, moe_cache_mib=mib_for_slots(tiny_model_path, 4))
    fmt = {"type": "json_schema", "schema": SCHEMA}
    with Context(model, params) as cached, Context(model, ContextParams(n_ctx=1024, n_threads=2, n_seq_max=4)) as plain:
        assert cached.cache_status().state == "on"
        for seed in range(4):
            res = chat(cached, CONVERSATION, 400, _sampled(seed), response_format=fmt)
            jsonschema.validate(json.loads(res.text), SCHEMA)
        greedy = chat(cached, CONVERSATION, 400, response_format=fmt)
        assert greedy.text == chat(plain, CONVERSATION, 400, response_format=fmt).text  # the cache changes no token
        res = generate_batch(cached, PROMPTS, 24, [_sampled(s) for s in range(4)], grammar=YES_NO)
        assert all(t in ("yes", "no") for t in res.texts), res.texts
        stats = cached.moe_cache_stats()
        assert stats is not None and stats.n_hit + stats.n_miss > 0


BAD = [
    (dict(grammar='root ::= ("yes" | '), r"grammar parser refuses.*error parsing grammar: expecting"),
    (dict(grammar='start ::= "x"'), r"does not contain a 'root' symbol"),
    (dict(grammar='root ::= yes-or-no'), r"Undefined rule identifier 'yes-or-no'"),
    (dict(grammar=""), r"grammar is empty"),
    (dict(grammar=42), r"grammar must be GBNF text"),
    (dict(response_format={"type": "json_schema", "schema": {"type": "frobnicate"}}),
     r"converter refuses the schema.*unrecognized type frobnicate"),
    (dict(response_format={"type": "json_schema", "schema": {"$ref": "https://example.com/ship.json"}}),
     r"converter refuses the schema.*unsupported \$ref"),
    (dict(response_format={"type": "json_schema", "schema": {"type": "object", "properties": []}}),
     r"properties must be an object"),
    (dict(response_format={"type": "json_schema", "schema": {"type": "string", "pattern": "^(ab$"}}),
     r"converter refuses the schema"),
    (dict(response_format={"type": "json_schema", "schema": {"type": "object", "x": {1, 2}}}), r"not JSON"),
    (dict(response_format={"type": "json_schema"}), r"needs a schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), r"needs a schema"),
    (dict(response_format={"type": "xml"}), r"type must be one of text, json_object, json_schema, got 'xml'"),
    (dict(response_format="json"), r"response_format must be a mapping"),
    (dict(grammar=YES_NO, response_format={"type": "json_object"}), r"not both"),
]


@pytest.mark.parametrize("bad, said", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_grammars_and_formats_are_refused_before_anything_is_evaluated(ctx, bad, said) -> None:
    ctx.decode(ctx.tokenize(PROMPTS[0]))  # a state to keep
    mem = ctx._lib.llama_get_memory(ctx._ptr)
    before = (ctx.perf(), ctx.n_past, list(ctx._evaluated), ctx._lib.llama_memory_seq_pos_max(mem, 0))

    def unchanged() -> None:
        assert (ctx.perf(), ctx.n_past, list(ctx._evaluated), ctx._lib.llama_memory_seq_pos_max(mem, 0)) == before

    calls = [lambda: chat(ctx, CONVERSATION, 8, **bad), lambda: ChatStream(ctx, CONVERSATION, 8, **bad)]
    if "response_format" not in bad:
        g = bad["grammar"]
        calls += [lambda: ctx.generate(PROMPTS[1], 8, grammar=g), lambda: ctx.complete(PROMPTS[1], 8, grammar=g),
                  lambda: generate_batch(ctx, PROMPTS[:2], 8, grammar=g),
                  lambda: stream_batch(ctx, PROMPTS[:2], 8, grammar=[None, g])]
    for call in calls:
        with pytest.raises(ParameterError, match=said):
            call()
        unchanged()


def test_the_llama_cpp_python_front_answers_in_openais_shapes(tiny_model_path, lib) -> None:
    with Llama(model_path=str(tiny_model_path), n_ctx=1024, model_params=RAM) as llm:
        out = llm.create_completion(PROMPTS[0], max_tokens=8, grammar=YES_NO, seed=1)
        assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
        choice = out["choices"][0]
        assert choice["text"] in ("yes", "no") and choice["finish_reason"] == "stop" and choice["index"] == 0
        assert out["usage"]["completion_tokens"] >= 1 and out["usage"]["total_tokens"] == \
            out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
        free = llm.create_completion(PROMPTS[0], max_tokens=12, temperature=0)
        assert free["choices"][0]["finish_reason"] == "length" and free["usage"]["completion_tokens"] == 12
        assert llm.create_completion(PROMPTS[0], max_tokens=12, temperature=0)["choices"][0]["text"] == \
            free["choices"][0]["text"]
        text = free["choices"][0]["text"]
        stop = text[3:6]
        cut = llm.create_completion(PROMPTS[0], max_tokens=12, temperature=0, stop=[stop])
        assert cut["choices"][0]["text"] == text[:text.find(stop)] and cut["choices"][0]["finish_reason"] == "stop"
        chat = llm.create_chat_completion(CONVERSATION, response_format={"type": "json_schema", "schema": SCHEMA})
        assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
        message = chat["choices"][0]["message"]
        assert message["role"] == "assistant" and chat["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(message["content"]), SCHEMA)
        with pytest.raises(ParameterError, match="type must be one of"):
            llm.create_chat_completion(CONVERSATION, response_format={"type": "yaml"})
