"""Prompt synthesis: turn a request's hash ids into exact token-id prompts with the trace's prefix sharing.

Block `h` of session `s` played with salt `k` is `block_size` tokens drawn from SplitMix64
streams seeded by (s, h, k); the request's remaining `input_tokens - block_size*len(hash_ids)`
tokens come from a stream seeded by (s, request index, k). Hence two requests that share a
leading run of hash ids send exactly the same token prefix (and a server's prefix cache can hit),
while a new salt (a recycled session) shares nothing with the previous play. A prompt may name a
history (a salt and hash ids): the leading blocks it shares with those ids are drawn with the
history's salt, so plays of different salts share a primed context and nothing after it.

The tokens are computed vectorised over whole prompts with numpy (the seeds of a request's
few new blocks as Python ints: cheaper than numpy calls on tiny arrays), and the last prompt of each
(session, salt) is kept in a bounded LRU cache: the next request of that session usually extends
it, so only its new blocks and tail are generated, and one whose blocks the cached prompt already
holds (and that has no tail) is a view of it, no numpy work at all. Hash ids are compared as
tuples: a request costs no array of the ids it shares with the cached prompt.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from traces.schema import Request

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_BLOCK_DOMAIN = 0x426C6F636B  # separates block streams from tail streams of the same session
_TAIL_DOMAIN = 0x5461696C
# numpy scalars made once: a prompt takes a few dozen numpy calls on small arrays, where making
# each constant anew was a measurable share of a request's client CPU
_GOLDEN_U64 = np.uint64(_GOLDEN)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_SHIFTS = tuple(np.uint64(n) for n in (27, 30, 31, 32))


def _splitmix64_scalar(x: int) -> int:
    z = (x + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser over a uint64 array, in place (numpy wraps uint64 arithmetic)."""
    shift27, shift30, shift31, _ = _SHIFTS
    scratch = np.empty_like(z)  # one temporary for all three shifts: fresh pages are what cost
    z += _GOLDEN_U64
    z ^= np.right_shift(z, shift30, out=scratch)
    z *= _MIX1
    z ^= np.right_shift(z, shift27, out=scratch)
    z *= _MIX2
    z ^= np.right_shift(z, shift31, out=scratch)
    return z


# Up to this many new blocks, their seeds are SplitMix64'd as Python ints: a request usually adds
# one or a few blocks, and the ten numpy calls of the vectorised finaliser cost more than that.
SCALAR_SEEDS_UP_TO = 16


def _block_seeds(hash_ids: tuple[int, ...], block_key: int) -> np.ndarray:
    """The SplitMix64 seeds of blocks `hash_ids` (uint64): the same values either way."""
    if len(hash_ids) <= SCALAR_SEEDS_UP_TO:
        return np.array([_splitmix64_scalar(h ^ block_key) for h in hash_ids], dtype=np.uint64)
    return _splitmix64(np.array(hash_ids, dtype=np.uint64) ^ np.uint64(block_key))


class PromptSynth:
    """Deterministic token-id prompts for trace requests (stateless apart from its cache)."""

    def __init__(
        self, block_size: int, vocab_size: int = 32000, vocab_offset: int = 0, cache_tokens: int = 1 << 24
    ) -> None:
        for name, value, low in (("block_size", block_size, 1), ("vocab_size", vocab_size, 1),
                                 ("vocab_offset", vocab_offset, 0), ("cache_tokens", cache_tokens, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"PromptSynth: {name} must be an integer >= {low}, got {value!r}")
        if vocab_offset + vocab_size > 2**31:
            raise ValueError(f"PromptSynth: vocab_offset + vocab_size must fit int32, got {vocab_offset + vocab_size}")
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.vocab_offset = vocab_offset
        self.cache_tokens = cache_tokens
        self._positions = np.arange(1, block_size + 1, dtype=np.uint64) * _GOLDEN_U64
        self._vocab_size = np.uint64(vocab_size)
        self._vocab_offset = np.int32(vocab_offset)
        self._session_keys: dict[str, int] = {}
        # (session id, salt, history salt) -> the latest prompt built for it (the longer one when the
        # latest was a prefix of it, so that the same prompt's key, blocks and ids are never built twice)
        self._cache: OrderedDict[tuple[str, int, int | None], _Cached] = OrderedDict()
        self._cached_tokens = 0

    def prompt(self, session_id: str, request: Request, salt: int,
               history: tuple[int, tuple[int, ...]] | None = None) -> np.ndarray:
        """The request's prompt: read-only int32 token ids, exactly `request.input_tokens` long.
        `history` (salt, hash ids): the leading blocks this request shares with those hash ids are
        drawn with that salt instead - a context primed once and shared by plays of other salts."""
        hash_ids = tuple(request.hash_ids)  # any sequence from a caller; a tuple is taken as it is
        block_size = self.block_size
        block_len = len(hash_ids) * block_size
        if block_len > request.input_tokens:
            raise ValueError(
                f"request {request.index}: {len(hash_ids)} hash ids of {block_size} tokens exceed its "
                f"{request.input_tokens} input tokens"
            )
        cache_key = (session_id, salt, None if history is None else history[0])
        cached = self._cache.pop(cache_key, None)
        if cached is None:
            key, shared = self._key(session_id, salt), 0
        else:
            self._cached_tokens -= cached.tokens.size
            key, shared = cached.key, _common_prefix(cached.hash_ids, hash_ids)
        if cached is not None and shared == len(hash_ids) and block_len == request.input_tokens:
            # Every block is cached and there is no tail: the prompt is a view of the cached one
            # (read-only), and the cache keeps the longer prompt it was cut from.
            self._remember(cache_key, cached)
            return cached.tokens[:block_len]
        out = np.empty(request.input_tokens, dtype=np.int32)
        if shared:
            out[: shared * block_size] = cached.tokens[: shared * block_size]  # type: ignore[union-attr]
        # The new blocks' and the tail's SplitMix64 states, turned into tokens in one pass.
        states = np.empty(request.input_tokens - shared * block_size, dtype=np.uint64)
        new_blocks = states[: block_len - shared * block_size]
        if new_blocks.size:
            # the leading new blocks the request shares with its history take the history's salt
            primed = 0 if history is None or shared >= len(history[1]) else \
                max(0, _common_prefix(history[1], hash_ids) - shared)
            seeds = _block_seeds(hash_ids[shared + primed:], key ^ _BLOCK_DOMAIN)
            if primed and history is not None:
                history_key = self._key(session_id, history[0]) ^ _BLOCK_DOMAIN
                seeds = np.concatenate([_block_seeds(hash_ids[shared:shared + primed], history_key), seeds])
            np.add(seeds[:, None], self._positions[None, :], out=new_blocks.reshape(len(seeds), block_size))
        tail = states[new_blocks.size:]
        if tail.size:
            seed = _splitmix64_scalar(key ^ _TAIL_DOMAIN ^ _splitmix64_scalar(request.index))
            np.add(self._steps(tail.size), np.uint64(seed), out=tail)
        if states.size:
            self._stream(states, out[shared * block_size:])
        out.flags.writeable = False  # the cache keeps a view of the blocks: no caller may change them
        if cached is not None and shared == len(hash_ids) and len(cached.hash_ids) > shared:
            self._remember(cache_key, cached)  # this prompt's blocks are a prefix of the cached ones
        elif block_len <= self.cache_tokens:
            self._remember(cache_key, _Cached(key, hash_ids, out[:block_len]))
        return out.view()  # a view of a read-only base: no caller can make the cached blocks writable

    def _steps(self, length: int) -> np.ndarray:
        """SplitMix64 increments 1..length times the golden gamma (a tail is usually shorter than a block)."""
        if length <= self.block_size:
            return self._positions[:length]
        return np.arange(1, length + 1, dtype=np.uint64) * _GOLDEN_U64

    def _stream(self, states: np.ndarray, out: np.ndarray) -> None:
        """Map SplitMix64 states (scratch: changed in place) to token ids in [vocab_offset,
        vocab_offset + vocab_size), written into the int32 array `out`."""
        z = _splitmix64(states)
        # Multiply-shift on the high 32 bits: uniform enough, and cheaper than a 64-bit modulo.
        shift32 = _SHIFTS[3]
        z >>= shift32
        z *= self._vocab_size
        z >>= shift32
        out[:] = z  # below vocab_size: the int32 cast is exact
        if self.vocab_offset:
            out += self._vocab_offset

    def _key(self, session_id: str, salt: int) -> int:
        base = self._session_keys.get(session_id)
        if base is None:
            digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
            base = self._session_keys.setdefault(session_id, int.from_bytes(digest, "little"))
        return _splitmix64_scalar(base ^ _splitmix64_scalar(int(salt) & _MASK))

    def _remember(self, cache_key: tuple[str, int, int | None], cached: _Cached) -> None:
        self._cache[cache_key] = cached
        self._cached_tokens += cached.tokens.size
        while self._cached_tokens > self.cache_tokens:
            _, evicted = self._cache.popitem(last=False)
            self._cached_tokens -= evicted.tokens.size


class _Cached(NamedTuple):
    """The latest prompt built for a (session, salt): its key, hash ids and block tokens."""

    key: int
    hash_ids: tuple[int, ...]
    tokens: np.ndarray  # read-only int32, len(hash_ids) blocks


def _common_prefix(old: tuple[int, ...], new: tuple[int, ...]) -> int:
    """How many leading hash ids two prompts share. Tuples compare in C: the usual answer (one
    extends the other) takes one comparison, no array."""
    n = min(len(old), len(new))
    if old[:n] == new[:n]:
        return n
    differ = np.flatnonzero(np.array(old[:n], dtype=np.uint64) != np.array(new[:n], dtype=np.uint64))
    return int(differ[0])
