"""Byte-level tokenizer and the minimal chat template of our server.

Ids 0..255 are raw UTF-8 bytes; special ids (BOS 256, EOS 257, then unused ids up to the model's
vocab size) sit above them and produce no text. There is no merge table: a text prompt of n UTF-8
bytes is exactly n tokens, which keeps prompt lengths predictable for load generation.

Chat template (documented in docs/server.md): BOS, then for each message
`<|{role}|>\\n{content}\\n`, then `<|assistant|>\\n` to open the reply. The markers are plain
bytes, so they are tokens like any other text.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BYTE_VOCAB = 256


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


class ByteTokenizer:
    def __init__(self, vocab_size: int, bos_token_id: int = 256, eos_token_id: int = 257) -> None:
        if vocab_size <= max(BYTE_VOCAB - 1, bos_token_id, eos_token_id):
            raise ValueError(
                f"vocab_size {vocab_size} must exceed the byte ids and the BOS/EOS ids"
            )
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Iterable[int]) -> str:
        return text_bytes(token_ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[ChatMessage]) -> list[int]:
        text = "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages) + "<|assistant|>\n"
        return [self.bos_token_id, *text.encode("utf-8")]


def text_bytes(token_ids: Iterable[int]) -> bytes:
    """The bytes of the byte tokens among `token_ids`; special ids carry no text."""
    return bytes(t for t in token_ids if t < BYTE_VOCAB)


class StreamDecoder:
    """Decodes generated ids chunk by chunk; a UTF-8 character split across chunks is held
    back until its last byte arrives, so every chunk's text is valid on its own."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, token_ids: Iterable[int]) -> str:
        return self._decoder.decode(text_bytes(token_ids))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
