"""Runs inside vLLM's own venv (started by conftest.VllmEngine): one offline vLLM engine in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so the connector's Prometheus counters are
this process's), driven by JSON commands on stdin, one reply line per command on stdout
prefixed with RESULT_PREFIX (vLLM logs to stderr).

    {"op": "generate", "prompt": [ids], "max_tokens": n}  -> {"tokens": [...], "logprobs": [...]}
    {"op": "reset_prefix_cache"}                          -> {"ok": true}
    {"op": "metrics"}                                     -> {"attnstore_vllm_...": value, ...}
"""

from __future__ import annotations

import argparse
import json
import sys

RESULT_PREFIX = "ATTNSTORE-DRIVER "


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--kv-cache-bytes", type=int, required=True)
    parser.add_argument("--kv-transfer-config", default="")
    args = parser.parse_args(argv)

    from prometheus_client import REGISTRY
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {"kv_transfer_config": json.loads(args.kv_transfer_config)} if args.kv_transfer_config else {}
    llm = LLM(
        model=args.model,
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=args.block_size,
        enable_prefix_caching=True,
        kv_cache_memory_bytes=args.kv_cache_bytes,
        max_model_len=1024,
        enforce_eager=True,
        seed=0,
        **extra,
    )
    reply({"ready": True})
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "generate":
            params = SamplingParams(
                temperature=0.0, max_tokens=command["max_tokens"], logprobs=0, detokenize=False
            )
            output = llm.generate([TokensPrompt(prompt_token_ids=command["prompt"])], params, use_tqdm=False)[
                0
            ]
            sample = output.outputs[0]
            logprobs = [
                entry[token].logprob for token, entry in zip(sample.token_ids, sample.logprobs, strict=True)
            ]
            reply({"tokens": list(sample.token_ids), "logprobs": logprobs})
        elif command["op"] == "reset_prefix_cache":
            reply({"ok": bool(llm.reset_prefix_cache())})
        elif command["op"] == "metrics":
            reply(
                {
                    metric.name: sample.value
                    for metric in REGISTRY.collect()
                    if metric.name.startswith("attnstore_vllm")
                    for sample in metric.samples
                    if sample.name.endswith("_total")
                }
            )


def reply(payload: dict) -> None:
    print(RESULT_PREFIX + json.dumps(payload), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
