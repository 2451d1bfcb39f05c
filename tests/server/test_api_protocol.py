"""Request validation and response formatting of the OpenAI wire format (no server needed)."""

from __future__ import annotations

import orjson
import pytest

from server.protocol import (
    SSE_DONE,
    ApiError,
    ResponseHeader,
    check_prompt,
    parse_chat_request,
    parse_completion_request,
    resolve_max_tokens,
)


def _completion(**fields):
    return parse_completion_request(orjson.dumps({"model": "tiny", "prompt": "hi", **fields}))


def _error(fn, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args, **kwargs)
    body = orjson.loads(info.value.body())["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return info.value


def test_completion_defaults_and_sampling_params():
    req = _completion(max_tokens=7, min_tokens=2, ignore_eos=True, temperature=0, top_p=0.5,
                      seed=3, stream=True, stream_options={"include_usage": True},
                      acceptance_length=2.5)
    assert req.prompt == "hi"
    params = req.options.sampling_params(7)
    assert (params.max_tokens, params.min_tokens, params.ignore_eos) == (7, 2, True)
    assert (params.temperature, params.top_p, params.seed, params.acceptance_length) == (0.0, 0.5, 3, 2.5)
    assert req.options.stream and req.options.include_usage
    assert _completion().options.max_tokens == 16  # OpenAI's completions default


@pytest.mark.parametrize("prompt, expected", [
    ([1, 2, 3], (1, 2, 3)), ([[4, 5]], (4, 5)), (["text"], "text"),
])
def test_prompt_forms(prompt, expected):
    assert _completion(prompt=prompt).prompt == expected


@pytest.mark.parametrize("fields, param", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": [1, 2.0]}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 5.0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"seed": 1.5}, "seed"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"model": 3}, "model"),
    ({"acceptance_length": 0.5}, "acceptance_length"),
    ({"n": 2}, "n"),
    ({"best_of": 3}, "best_of"),
    ({"logprobs": 5}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"stop": ["\n"]}, "stop"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logit_bias": {"1": 2}}, "logit_bias"),
])
def test_invalid_completion_fields_are_400_naming_the_param(fields, param):
    err = _error(_completion, **fields)
    assert err.status == 400 and err.param == param and param in err.message


def test_neutral_values_of_unsupported_options_are_accepted():
    req = _completion(n=1, best_of=1, logprobs=None, echo=False, stop=[], presence_penalty=0,
                      frequency_penalty=0.0, logit_bias={}, user="someone", unknown_field=1)
    assert req.prompt == "hi"


@pytest.mark.parametrize("fields, param", [
    ({"top_k": -5}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": "x"}, "frequency_penalty"),
    ({"n": 0}, "n"),
    ({"best_of": -1}, "best_of"),
    ({"logprobs": -1}, "logprobs"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"stop": 5}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"use_beam_search": "yes"}, "use_beam_search"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
])
def test_out_of_range_sampling_fields_are_invalid_values(fields, param):
    err = _error(_completion, **fields)
    assert (err.status, err.param, err.code) == (400, param, "invalid_value")
    assert err.message.startswith(param + ": must be")


@pytest.mark.parametrize("fields, param", [
    ({"top_k": 50}, "top_k"), ({"min_p": 0.1}, "min_p"), ({"use_beam_search": True}, "use_beam_search"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"), ({"truncate_prompt_tokens": 10}, "truncate_prompt_tokens"),
    ({"guided_regex": "a+"}, "guided_regex"),
])
def test_valid_but_unsupported_sampling_fields_are_refused(fields, param):
    err = _error(_completion, **fields)
    assert (err.status, err.param, err.code) == (400, param, "unsupported_option")


def test_neutral_sampling_fields_pass_and_unknown_fields_are_listed_as_ignored():
    req = _completion(top_k=-1, min_p=0, repetition_penalty=1.0, use_beam_search=False, top_logprobs=0,
                      length_penalty=1, metadata={"a": "b"}, mirostat=2, zzz=None)
    assert req.ignored_fields == ("mirostat", "zzz")
    assert _completion(top_k=0).ignored_fields == ()
    chat = parse_chat_request(orjson.dumps({"messages": [{"role": "user", "content": "x"}], "prompt": "p",
                                            "max_completion_tokens": 3}))
    assert chat.ignored_fields == ("prompt",)


def test_seed_beyond_64_bits_is_refused():
    # orjson reads it as a float; a torch generator could not take it (the engine would crash).
    err = _error(parse_completion_request, b'{"prompt": "x", "seed": 18446744073709551619}')
    assert err.status == 400 and err.param == "seed"


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"", b"\"text\""])
def test_body_must_be_a_json_object(body):
    err = _error(parse_completion_request, body)
    assert err.status == 400 and err.code == "invalid_json"


def test_chat_messages_and_max_completion_tokens():
    req = parse_chat_request(orjson.dumps({
        "messages": [{"role": "system", "content": "s"},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": None}],
        "max_completion_tokens": 9, "max_tokens": 3,
    }))
    assert [(m.role, m.content) for m in req.messages] == [("system", "s"), ("user", "ab"), ("assistant", "")]
    assert req.options.max_tokens == 9
    assert parse_chat_request(b'{"messages": [{"role": "user", "content": "x"}]}').options.max_tokens is None


@pytest.mark.parametrize("messages, param", [
    (None, "messages"),
    ([], "messages"),
    (["hi"], "messages[0]"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0]"),
])
def test_invalid_chat_messages(messages, param):
    err = _error(parse_chat_request, orjson.dumps({"messages": messages}))
    assert err.status == 400 and err.param == param


def test_prompt_ids_must_be_in_vocabulary():
    check_prompt((0, 1023), 1024)
    err = _error(check_prompt, (5, 1024), 1024)
    assert err.status == 400 and "1024" in err.message


def test_context_limit_refuses_instead_of_truncating():
    opts = _completion(max_tokens=10).options
    assert resolve_max_tokens(opts, 90, 100) == 10
    err = _error(resolve_max_tokens, opts, 91, 100)
    assert err.code == "context_length_exceeded" and err.status == 400
    chat = parse_chat_request(b'{"messages": [{"role": "user", "content": "x"}]}').options
    assert resolve_max_tokens(chat, 60, 100) == 40  # no max_tokens: the rest of the context
    assert _error(resolve_max_tokens, chat, 100, 100).code == "context_length_exceeded"
    at_least = parse_chat_request(b'{"messages": [{"role": "user", "content": "x"}], "min_tokens": 50}').options
    assert _error(resolve_max_tokens, at_least, 60, 100).param == "min_tokens"


def test_default_max_tokens_is_clamped_to_the_room_left():
    default = _completion().options
    assert resolve_max_tokens(default, 10, 100) == 16
    assert resolve_max_tokens(default, 99, 100) == 1  # OpenAI-compatible: the default shrinks to fit
    err = _error(resolve_max_tokens, default, 100, 100)
    assert (err.status, err.param, err.code) == (400, "prompt", "context_length_exceeded")
    assert "leaving no room to generate" in err.message
    explicit = _completion(max_tokens=16).options
    assert _error(resolve_max_tokens, explicit, 99, 100).param == "max_tokens"  # sent: never truncated
    at_least = _completion(min_tokens=5).options
    assert _error(resolve_max_tokens, at_least, 97, 100).param == "min_tokens"


def test_stream_chunks_carry_text_token_ids_and_usage_field():
    header = ResponseHeader("cmpl-1", 5, "tiny", chat=False)
    raw = header.chunk("ab", (97, 98, 257), None, first=True, with_usage_field=True)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    chunk = orjson.loads(raw[6:])
    assert chunk["object"] == "text_completion" and chunk["usage"] is None
    assert chunk["choices"][0] == {"index": 0, "text": "ab", "logprobs": None,
                                   "finish_reason": None, "token_ids": [97, 98, 257]}
    chat = ResponseHeader("chatcmpl-1", 5, "tiny", chat=True)
    first = orjson.loads(chat.chunk("a", (97,), None, True, False)[6:])
    later = orjson.loads(chat.chunk("b", (98,), "length", False, False)[6:])
    assert first["object"] == "chat.completion.chunk" and "usage" not in first
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert later["choices"][0]["delta"] == {"content": "b"}
    assert later["choices"][0]["finish_reason"] == "length"
    usage = orjson.loads(chat.usage_chunk({"prompt_tokens": 1})[6:])
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 1}
    assert SSE_DONE == b"data: [DONE]\n\n"
