"""One request's state inside the engine: its tokens, how many have KV in the cache, its blocks.

A sequence's `token_ids` are the prompt followed by every generated token. The KV of the first
`num_computed_tokens` of them is in the cache, in the blocks listed by `block_ids`. Preemption
by recompute only resets `num_computed_tokens` and the blocks; the tokens stay, so the request
resumes exactly where it stopped.

With speculative decoding, `draft_token_ids` holds the drafts proposed for the next step; they
join `token_ids` only while that step runs the model, so everything else only ever sees
committed tokens.

With overlapped scheduling (server/engine/pending.py) the last of `token_ids` may be a
placeholder (< 0) for a token the device has sampled but the host has not read yet; with
speculative decoding several may be (the step's accepted drafts and its token), and the drafts
themselves may be placeholders for the draft head's tokens.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, TypeVar

from server.engine.messages import SamplingParams

if TYPE_CHECKING:
    import numpy as np
    import torch

# Placeholders of two launched steps can sit in one request at once (speculative steps: the step
# in flight's token after the accepted drafts of the step before); alternate steps number their
# rows from two banks so that resolving one step never touches the other's.
PLACEHOLDER_BANK = 1 << 24
# A token id, or a numpy or torch array of them.
TokenIds = TypeVar("TokenIds", int, "np.ndarray", "torch.Tensor")


def placeholder(row: int, bank: int = 0) -> int:
    """The stand-in token id of row `row` of a launched step's sampled tokens (always < 0); the
    step's `bank` (0 or 1) tells it apart from the step launched before or after it."""
    return -1 - row - bank * PLACEHOLDER_BANK


def placeholder_row(token: TokenIds) -> TokenIds:
    """The row of a launched step's sampled tokens that placeholder `token` stands for (a token id,
    or a numpy or torch array of them: the same arithmetic on each)."""
    return (-1 - token) % PLACEHOLDER_BANK


def placeholder_bank(token: int) -> int:
    """The bank (0 or 1) of the launched step that placeholder `token` belongs to."""
    return (-1 - token) // PLACEHOLDER_BANK


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float) -> None:
        self.request_id = request_id
        self.params = params
        self.arrival_time = arrival_time
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.block_ids: list[int] = []
        # Bumped whenever block_ids loses entries (otherwise it only grows at the end), so a copy
        # of its first entries made at the same epoch is still valid (the runner's block-table rows).
        self.block_epoch = 0
        self.block_hashes: list[int] = []  # chained hashes of this sequence's full, computed blocks
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.admitted_once = False
        self.draft_token_ids: list[int] = []
        self.num_drafts = 0  # verify steps that checked drafts (cumulative, for usage)
        self.num_draft_tokens = 0  # drafts verified so far
        self.num_accepted_tokens = 0  # of which accepted
        self.num_reported_tokens = 0  # output tokens handed to the caller so far

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Placeholders at the end of token_ids, for tokens not back from the device: a step's, and
        while the next step is being launched, that step's (with speculative decoding, its accepted
        drafts too)."""
        n = 0
        while n < len(self.token_ids) and self.token_ids[-1 - n] < 0:
            n += 1
        return n

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
