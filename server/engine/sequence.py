"""One request's state inside the engine: its tokens, how many have KV in the cache, its blocks.

A sequence's `token_ids` are the prompt followed by every generated token. The KV of the first
`num_computed_tokens` of them is in the cache, in the blocks listed by `block_ids`. Preemption
by recompute only resets `num_computed_tokens` and the blocks; the tokens stay, so the request
resumes exactly where it stopped.

With speculative decoding, `draft_token_ids` holds the drafts proposed for the next step; they
join `token_ids` only while that step runs the model, so everything else only ever sees
committed tokens.

With overlapped scheduling (server/engine/pending.py) the last of `token_ids` may be a
placeholder (< 0) for a token the device has sampled but the host has not read yet.
"""

from __future__ import annotations

import enum

from server.engine.messages import SamplingParams


def placeholder(row: int) -> int:
    """The stand-in token id of row `row` of the previous step's sampled tokens (always < 0)."""
    return -1 - row


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

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Placeholders at the end of token_ids, for tokens not back from the device: at most two
        (a step's, and while the next step is being launched, that step's)."""
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
