"""Byte tokenizer: exact byte round trips, special ids, chat template, streamed UTF-8 decoding."""

from __future__ import annotations

import pytest

from server.tokenizer import ByteTokenizer, ChatMessage, StreamDecoder


def test_text_round_trips_byte_for_byte():
    tok = ByteTokenizer(1024)
    text = "def f(x):\n    return x  # héllo ✓ 🚀"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_special_ids_produce_no_text():
    tok = ByteTokenizer(1024)
    assert tok.decode([104, 256, 105, 257, 1000]) == "hi"


def test_chat_template_is_bos_then_role_markers():
    tok = ByteTokenizer(1024)
    ids = tok.apply_chat_template([ChatMessage("system", "be brief"), ChatMessage("user", "hi")])
    assert ids[0] == tok.bos_token_id
    assert bytes(ids[1:]).decode() == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"


def test_stream_decoder_holds_back_split_characters():
    data = "é🚀x".encode()
    dec = StreamDecoder()
    pieces = [dec.decode([b]) for b in data]
    assert "".join(pieces) + dec.flush() == "é🚀x"
    assert pieces[0] == ""  # first byte of a 2-byte character waits for the second
    assert all("\ufffd" not in p for p in pieces)


def test_stream_decoder_replaces_invalid_bytes_on_flush():
    dec = StreamDecoder()
    assert dec.decode([0xE2, 0x9C]) == ""
    assert dec.flush() == "\ufffd"


def test_vocab_must_exceed_special_ids():
    with pytest.raises(ValueError, match="vocab_size"):
        ByteTokenizer(257)
