"""The load a service cell sends: streamed OpenAI-compatible `/v1/completions` requests, timed
per request from the client's side.

One request: a prompt of exactly `context_length` tokens — `prompt: text` repeats
`prompt_word` (one token per repeat for the tokenizer it is meant for; the engine's own count,
`usage.prompt_tokens`, is checked when it reports one), `prompt: token_ids` sends token ids,
which SGLang and vLLM accept in place of text — and `output_tokens` new tokens at temperature 0.
Per request: TTFT (send to first streamed text), inter-token latency (gaps between streamed
chunks after the first: engines stream a token per chunk unless they batch the stream), output
tokens/s (tokens after the first over the time after the first). Every departure from the
stream the OpenAI API defines — an HTTP error, a JSON body where a stream was asked for, a chunk
that is not JSON, an `error` chunk, fewer or more tokens than asked — fails the cell with one
line saying which.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from harness.worker.service_proc import ServiceError

SHOW = 160           # characters of a bad body quoted in an error


def _requests():
    try:
        import requests
    except ImportError:
        raise ServiceError("the service workload needs `requests` on the worker host "
                           "(pip install requests)") from None
    return requests


def prompt(cell: dict):
    n = cell["context_length"]
    if cell["prompt"] == "token_ids":
        # Ids every real vocabulary has (>= 32k entries), spread so no run repeats one id.
        return [1000 + (cell["seed"] + 7919 * i) % 20000 for i in range(n)]
    return cell["prompt_word"] * n


def one_request(session, url: str, body: dict, headers: dict, timeout: float) -> dict:
    requests = _requests()
    t0 = time.perf_counter()
    try:
        response = session.post(url, json=body, headers=headers, stream=True, timeout=timeout)
    except requests.RequestException as exc:
        raise ServiceError(f"POST {url}: {type(exc).__name__}: {str(exc)[:SHOW]}") from None
    with response:
        if response.status_code != 200:
            raise ServiceError(f"POST {url}: HTTP {response.status_code}: "
                               f"{response.text[:SHOW].strip()!r}")
        kind = response.headers.get("content-type", "")
        if "text/event-stream" not in kind:
            raise ServiceError(f"POST {url}: not a streamed response (content-type {kind!r}): "
                               f"{response.text[:SHOW].strip()!r}")
        arrivals, usage, done = [], None, False
        try:
            # Engines stream with chunked transfer encoding, which urllib3 hands over chunk by
            # chunk as it arrives: a chunk's time is its token's.
            for raw in response.iter_lines():
                line = raw.decode("utf-8", "replace").strip() if raw else ""
                if not line.startswith("data:"):
                    continue      # blank separators, `:` keep-alives, `event:` names
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise ServiceError(f"POST {url}: a stream chunk is not JSON: "
                                       f"{data[:SHOW]!r}") from None
                if not isinstance(chunk, dict):
                    raise ServiceError(f"POST {url}: a stream chunk is not an object: "
                                       f"{data[:SHOW]!r}")
                if "error" in chunk:
                    raise ServiceError(f"POST {url}: the engine streamed an error: "
                                       f"{str(chunk['error'])[:SHOW]}")
                choices = chunk.get("choices") or []
                if choices and isinstance(choices[0], dict) and choices[0].get("text"):
                    arrivals.append(time.perf_counter())
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
        except requests.RequestException as exc:
            raise ServiceError(f"POST {url}: the stream broke: {type(exc).__name__}: "
                               f"{str(exc)[:SHOW]}") from None
    if not arrivals:
        raise ServiceError(f"POST {url}: the stream carried no text"
                           + ("" if done else " and no [DONE]"))
    tokens = usage.get("completion_tokens") if usage else None
    return {"t0": t0, "arrivals": arrivals, "end": arrivals[-1],
            "tokens": tokens if isinstance(tokens, int) else len(arrivals),
            "prompt_tokens": usage.get("prompt_tokens") if usage else None}


def _check(cell: dict, r: dict, url: str) -> None:
    if r["prompt_tokens"] is not None and r["prompt_tokens"] != cell["context_length"]:
        raise ServiceError(f"POST {url}: the engine counted {r['prompt_tokens']} prompt tokens, "
                           f"not context_length {cell['context_length']} (prompt_word "
                           f"{cell['prompt_word']!r} is not one token for this tokenizer: use "
                           f"another word or prompt: token_ids)")
    if r["tokens"] != cell["output_tokens"]:
        raise ServiceError(f"POST {url}: the engine returned {r['tokens']} tokens, not "
                           f"output_tokens {cell['output_tokens']} (it stopped early: set "
                           f"ignore_eos: true where the engine supports it)")


def per_request(r: dict) -> dict:
    ttft = (r["arrivals"][0] - r["t0"]) * 1e3
    gaps = [(b - a) * 1e3 for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    after_first = r["end"] - r["arrivals"][0]
    out = {"ttft_ms": ttft, "itl_ms": gaps, "tokens": r["tokens"]}
    if after_first > 0 and r["tokens"] > 1:
        out["output_tokens_per_s"] = (r["tokens"] - 1) / after_first
    return out


class Load:
    """Requests of one cell against one engine (one HTTP session per sending thread)."""

    def __init__(self, cell: dict, model: str, api_key: str | None):
        requests = _requests()
        self.cell = cell
        self.url = cell["service_url"].rstrip("/") + "/v1/completions"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # include_usage: the engine's own token counts in a last chunk (vLLM and SGLang send
        # none without it; transformers serve ignores the option and sends them anyway).
        self.body = {"model": model, "prompt": prompt(cell), "max_tokens": cell["output_tokens"],
                     "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        if cell["ignore_eos"]:
            self.body["ignore_eos"] = True
        self._requests = requests
        self._local = threading.local()      # a session (its connection) per sending thread
        self.sessions = []

    def _run(self, _: int) -> dict:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self._requests.Session()
            self.sessions.append(session)
        r = one_request(session, self.url, self.body, self.headers,
                        self.cell["request_timeout_s"])
        _check(self.cell, r, self.url)
        return r

    def batch(self, n: int) -> tuple[list[dict], float]:
        """`n` requests, `concurrency` in flight: (their timings, wall seconds of the batch)."""
        c = self.cell["concurrency"]
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=c) as pool:
            results = list(pool.map(self._run, range(n)))
        return results, max(r["end"] for r in results) - start

    def close(self) -> None:
        for s in self.sessions:
            s.close()
