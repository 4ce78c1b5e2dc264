"""Chat on the real library: the synthetic model's own ChatML template through llama_chat_apply_template, answers
that end at the end-of-generation token, a stop string or max_tokens, streaming, the previous turn kept, and
bad input refused before anything is evaluated."""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from llama_moe import ChatMessage, ChatResult, ChatTemplateError, Context, ContextParams, Model, ModelParams, \
    ParameterError, Sampling
from llama_moe.chat import ChatStream, builtin_templates, chat, format_chat, model_template
from llama_moe.tools.synth import CHAT_TEMPLATE

CONVERSATION = [{"role": "system", "content": "You write short stories."},
                {"role": "user", "content": "The ship left the harbour at dawn, and the crew"}]
CHATML = ("<|im_start|>system\nYou write short stories.<|im_end|>\n"
          "<|im_start|>user\nThe ship left the harbour at dawn, and the crew<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def model(lib, tiny_model_path):
    with Model(tiny_model_path, ModelParams(cpu_moe=True, repack=False)) as m:
        yield m


@pytest.fixture()
def ctx(model):
    with Context(model, ContextParams(n_ctx=512, n_threads=2)) as c:
        yield c


@pytest.fixture(scope="module")
def untemplated_path(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its tokenizer.chat_template key renamed (same length): a model without a template."""
    data = tiny_model_path.read_bytes()
    assert data.count(b"tokenizer.chat_template") == 1
    path = tmp_path_factory.mktemp("untemplated") / "tiny-no-template.gguf"
    path.write_bytes(data.replace(b"tokenizer.chat_template", b"tokenizer.chat_templatX"))
    return path


def _alone(model: Model, prompt: str, n: int) -> list[int]:
    """Greedy tokens of the formatted prompt, decoded by generate() in a fresh context, up to an end of generation."""
    with Context(model, ContextParams(n_ctx=512, n_threads=2)) as ctx:
        return list(ctx.generate(model.tokenize(prompt, parse_special=True), n, stop_at_eog=True))


def test_the_model_carries_a_chatml_template_that_llama_cpp_applies(model) -> None:
    assert model_template(model) == CHAT_TEMPLATE
    assert model_template(model, "tool_use") is None
    assert format_chat(model, CONVERSATION) == CHATML
    assert format_chat(model, CONVERSATION, add_generation_prompt=False) == CHATML.removesuffix("<|im_start|>assistant\n")
    assert format_chat(model, [ChatMessage(**m) for m in CONVERSATION]) == CHATML
    # a built-in template by name, and another format
    assert "chatml" in builtin_templates() and "llama3" in builtin_templates()
    assert format_chat(model, CONVERSATION, "chatml") == CHATML
    assert "<|start_header_id|>user<|end_header_id|>" in format_chat(model, CONVERSATION, "llama3")
    # the template's special tokens become single tokens
    tokens = model.tokenize(CHATML, parse_special=True)
    im_start = model.tokenize("<|im_start|>", parse_special=True)
    assert len(im_start) == 1 and tokens.count(im_start[0]) == 3


def test_chat_answers_as_generate_does_and_ends_at_the_end_of_turn(model, ctx) -> None:
    res = chat(ctx, CONVERSATION, max_tokens=48)
    assert isinstance(res, ChatResult)
    assert res.prompt == CHATML and res.prompt_tokens == tuple(model.tokenize(CHATML, parse_special=True))
    assert list(res.tokens) == _alone(model, CHATML, 48)
    assert res.text == model.detokenize(res.tokens)
    assert res.finish_reason == ("length" if len(res.tokens) == 48 else "stop")
    assert res.message == {"role": "assistant", "content": res.text}
    assert res.prompt_seconds > 0 and res.gen_seconds >= 0 and res.n_reused == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.text = "x"  # type: ignore[misc]
    # the end of generation: sampled text reaches <|im_end|>, which ends the answer and is not in it
    eog_seen = False
    for seed in range(12):
        res = chat(ctx, CONVERSATION, max_tokens=160, sampling=Sampling(temperature=1.5, top_k=0, seed=seed))
        assert not any(model.is_eog(t) for t in res.tokens)
        if res.finish_reason == "stop":
            eog_seen = True
            assert len(res.tokens) < 160
            break
    assert eog_seen, "no sampled answer ended at an end-of-generation token"


def test_stop_strings_cut_the_text_and_the_stream_gives_the_same_answer(model, ctx) -> None:
    full = chat(ctx, CONVERSATION, max_tokens=40)
    assert len(full.text) > 20
    stop = full.text[12:16]
    cut = chat(ctx, CONVERSATION, max_tokens=40, stop=[stop, "never in the text \u2603"])
    assert cut.finish_reason == "stop" and cut.text == full.text[:full.text.index(stop)]
    assert full.tokens[:len(cut.tokens)] == cut.tokens
    with ChatStream(ctx, CONVERSATION, max_tokens=40, stop=[stop]) as stream:
        pieces = list(stream)
    assert "".join(pieces) == cut.text and stop not in "".join(pieces)
    assert stream.result is not None and stream.result.tokens == cut.tokens
    stream = ChatStream(ctx, CONVERSATION, max_tokens=40)
    assert "".join(stream) == full.text and stream.result.tokens == full.tokens


def test_the_next_turn_keeps_the_previous_one_and_answers_as_a_fresh_context(model, ctx) -> None:
    first = chat(ctx, CONVERSATION, max_tokens=24)
    turn = CONVERSATION + [first.message, {"role": "user", "content": "And then the storm came"}]
    second = chat(ctx, turn, max_tokens=24)
    assert second.n_reused >= len(first.prompt_tokens)
    with Context(model, ContextParams(n_ctx=512, n_threads=2)) as fresh:
        again = chat(fresh, turn, max_tokens=24)
    assert again.n_reused == 0 and again.tokens == second.tokens
    # a generate() in between is seen: its tokens are not mistaken for the conversation's
    list(ctx.generate(" and", 4))
    third = chat(ctx, turn, max_tokens=24)
    assert third.tokens == second.tokens


def test_tool_call_text_goes_through_untouched(model, ctx) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    messages = [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": call},
                {"role": "tool", "content": '{"temp_c": 4}'}]
    prompt = format_chat(model, messages)
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in prompt
    assert '<|im_start|>tool\n{"temp_c": 4}<|im_end|>' in prompt
    res = chat(ctx, messages, max_tokens=16)
    assert res.prompt == prompt and res.text == model.detokenize(res.tokens)


def test_bad_input_is_refused_before_anything_is_evaluated(model, ctx, untemplated_path) -> None:
    list(ctx.generate("The ship", 2))
    n_past = ctx.n_past
    cases = [([], ParameterError, "empty"), ("hello", ParameterError, "list of messages"),
             ([{"role": "narrator", "content": "x"}], ParameterError, "role must be one of"),
             ([{"role": "user"}], ParameterError, "needs a 'role' and a 'content'"),
             ([{"role": "user", "content": None}], ParameterError, "content must be a string"),
             ([{"role": "user", "content": "a\0b"}], ParameterError, "without NUL"),
             ([{"role": "assistant", "content": "", "tool_calls": []}], ParameterError, "only 'role' and 'content'"),
             ([("user", "hi")], ParameterError, "ChatMessage or a mapping")]
    for messages, cls, text in cases:
        with pytest.raises(cls, match=text):
            chat(ctx, messages)
        with pytest.raises(cls, match=text):
            ChatStream(ctx, messages)
    with pytest.raises(ChatTemplateError, match="no chat template named 'tool_use'"):
        chat(ctx, CONVERSATION, template="tool_use")
    with pytest.raises(ChatTemplateError, match="cannot apply"):
        chat(ctx, CONVERSATION, template="{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ParameterError, match="max_tokens"):
        chat(ctx, CONVERSATION, max_tokens=-1)
    with pytest.raises(ParameterError, match="stop must be"):
        chat(ctx, CONVERSATION, stop="\n")
    with pytest.raises(ParameterError, match="does not fit"):
        chat(ctx, [{"role": "user", "content": "word " * 600}])
    assert ctx.n_past == n_past  # nothing was evaluated or dropped
    with Model(untemplated_path, ModelParams(cpu_moe=True, repack=False)) as bare, \
            Context(bare, ContextParams(n_ctx=256, n_threads=2)) as bare_ctx:
        assert model_template(bare) is None
        with pytest.raises(ChatTemplateError, match="has no chat template"):
            chat(bare_ctx, CONVERSATION)
        assert chat(bare_ctx, CONVERSATION, max_tokens=4, template="chatml").prompt == CHATML  # a named one works


def test_concurrent_chats_on_one_context_queue(model, ctx) -> None:
    turns = [CONVERSATION, [{"role": "user", "content": "To grow tomatoes in a small garden, start with"}]]
    expected = [chat(ctx, t, max_tokens=16).tokens for t in turns]
    got: dict[int, list[tuple[int, ...]]] = {k: [] for k in range(4)}

    def worker(k: int) -> None:
        for _ in range(3):
            got[k].append(chat(ctx, turns[k % 2], max_tokens=16).tokens)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {k: [expected[k % 2]] * 3 for k in range(4)}
