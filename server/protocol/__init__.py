"""The OpenAI wire format: request JSON -> typed, validated parameters, and the response bodies.

Validation is strict about types (a bool is not an int, a string is not a number) and refuses
options the engine cannot honour (n > 1, logprobs, stop strings, penalties...) instead of
ignoring them, so a benchmark never silently measures something other than what it asked for.
Options the engine cannot honour are validated like vLLM validates them (`top_k: -5` is
`invalid_value`) and then refused unless neutral (`top_k: 50` is `unsupported_option`). Unknown
fields are ignored, as vLLM and OpenAI-compatible servers do, and listed in the response header
`X-Ignored-Fields` (escaped to visible ASCII and bounded: see `ignored_fields_header`). A
temperature below `GREEDY_TEMPERATURE` is greedy, as in vLLM. Every refusal is an `ApiError`
(400) whose OpenAI-style body names the offending parameter. Without max_tokens, a completion's
default of 16 (a chat's whole context) is clamped to the room the prompt leaves.

Extension fields (read only by our server): request `acceptance_length` (this request's
synthetic speculative acceptance length, in [1, k+1]; refused unless the server runs synthetic
speculative decoding); response `choices[i].token_ids` (the generated ids of that chunk or
response, including special ids that produce no text); `usage.spec_decode` = {num_drafts
(verify steps that checked drafts), num_draft_tokens, num_accepted_tokens} for the request, only
when the server speculates (measured AL = 1 + num_accepted_tokens / num_drafts); /v1/models
`speculative` = {method, num_speculative_tokens, rejection_sample_method,
synthetic_acceptance_length (the server's default mean AL, null for `standard`)} or null.

- errors.py: `ApiError` and its `ErrorCode`s;
- fields.py: the fields read, refused unless neutral, inert, or unknown (`X-Ignored-Fields`);
- requests.py: parsing and validating a request body, and the checks that need the model;
- responses.py: response bodies, SSE chunks, usage and the /v1/models speculative card.

The names below are the package's interface; import them from `server.protocol`.
"""

from server.protocol.errors import ApiError, ErrorCode
from server.protocol.fields import IGNORED_FIELDS_HEADER, MAX_IGNORED_NAMES, ignored_fields_header
from server.protocol.requests import (
    ChatRequest,
    CompletionRequest,
    GenerationOptions,
    check_acceptance_length,
    check_prompt,
    parse_chat_request,
    parse_completion_request,
    resolve_max_tokens,
)
from server.protocol.responses import SSE_DONE, ResponseHeader, speculative_card, sse_error, usage

__all__ = [
    "IGNORED_FIELDS_HEADER", "MAX_IGNORED_NAMES", "SSE_DONE", "ApiError", "ChatRequest", "CompletionRequest",
    "ErrorCode", "GenerationOptions", "ResponseHeader", "check_acceptance_length", "check_prompt",
    "ignored_fields_header", "parse_chat_request", "parse_completion_request", "resolve_max_tokens",
    "speculative_card", "sse_error", "usage",
]
