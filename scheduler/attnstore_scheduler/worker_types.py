"""What the scheduler asks of a worker and what it learns from one, as its own types: the
worker's messages are built and read only in worker_client.py (worker_messages.py maps
them), as the worker's turn_types.py does on its side of the same calls."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelCard:
    """What a worker serves (DescribeModel): the limits the scheduler checks requests
    against and the KV geometry it sizes budgets with. 0: not reported."""

    model_label: str = ""  # a human-readable name (the model directory's)
    chunk_tokens: int = 0  # tokens per KV chunk
    kv_bytes_per_token: int = 0  # over all layers, K and V
    max_context_tokens: int = 0  # the context window: a truncated prompt plus its answer
    max_prompt_tokens: int = 0  # the longest untruncated prompt ExecuteTurn accepts
    max_new_tokens: int = 0  # the largest max_tokens
    max_samples: int = 0  # the largest n (0: one answer, a worker that names none)
    max_turn_context_tokens: int = 0  # the longest context one turn may have there (0: it decides)


@dataclass(frozen=True)
class SamplingParams:
    """How a worker draws a turn's tokens, once validation.sampling has checked a request's
    GenerationOptions and filled in the defaults."""

    max_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float | None = None  # None: no nucleus cut
    seed: int | None = None  # None: the worker's random one (only greedy turns go without)
    stop_strings: tuple[str, ...] = ()
    n: int = 1  # answers drawn from the one prompt


@dataclass(frozen=True)
class PmlPrompt:
    """A prompt in PML against a schema, its boundary repair checked (pml_requests.py)."""

    schema: str  # the schema document
    prompt: str  # the <prompt schema="..."> document
    repair_tokens: int = 0
    repair_method: str = ""  # "first", "deviation"; "": the worker's setting
    repair_fraction: float = 0.0
    add_generation_prompt: bool = False


@dataclass(frozen=True)
class ChatMessages:
    """A conversation the worker renders with the model's chat template."""

    messages: tuple[tuple[str, str], ...]  # (role, content), oldest first


@dataclass(frozen=True)
class TokenIds:
    """A whole prompt as token ids, chat template applied."""

    token_ids: tuple[int, ...]


TurnPrompt = ChatMessages | TokenIds | PmlPrompt


@dataclass
class TurnRequest:
    """One ExecuteTurn: built on the worker that runs it (turn_runner.PrepareTurn), which
    then names the peers that may hold its oldest KV."""

    tenant: str
    prompt: TurnPrompt
    sampling: SamplingParams
    truncated_tokens: int = 0  # the session's truncation so far
    save_generated: bool = False  # also save the answer's KV (a session's next history)
    history_tokens: int = 0  # leading prompt tokens the session's earlier turns ran
    long_context_peers: tuple[str, ...] = ()  # workers that may hold its oldest KV (DistAttention)

    def prompt_token_ids(self) -> tuple[int, ...] | None:
        """The prompt's token ids; None when the worker builds them (messages, PML)."""
        return self.prompt.token_ids if isinstance(self.prompt, TokenIds) else None


@dataclass(frozen=True)
class EncodedModule:
    """One module (or scaffold) of a schema that EncodeSchema has done."""

    done: int  # modules done so far, this one included
    total: int
    module: str  # its dotted path
    encoded: bool  # False: the store already held it
    namespace: bytes  # of chunk_keys
    chunk_keys: tuple[bytes, ...]
