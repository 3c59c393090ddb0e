"""A chat exchange answered by the real runtime (tiny model, Redis, Triton, chat API), printed.

``python -m chatfleet_platform.localruntime.demo [--workdir DIR]``; the platform demo can call ``chat_exchange(api_url)``
against a runtime it already runs, or ``run_demo(workdir)`` to start one (everything stopped at the end).
The tiny model's weights are random, so the words are gibberish: what the demo shows is the path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from chatfleet_platform.localruntime.testing import local_runtime, post_json


def _stream(api_url: str, body: dict) -> tuple[str, float, int]:
    """Send a streaming request; return (text, seconds to first text, number of SSE chunks)."""
    req = urllib.request.Request(
        f"{api_url}/v1/chat/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0, first, parts, chunks = time.monotonic(), None, [], 0
    with urllib.request.urlopen(req, timeout=60) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content", "")
            if delta and first is None:
                first = time.monotonic() - t0
            parts.append(delta)
    return "".join(parts), first or 0.0, chunks


def chat_exchange(
    api_url: str, out: Callable[[str], None] = print, session_id: str = "demo-conversation"
) -> dict:
    """Two turns of one conversation (the second streamed) plus one bad request; returns a summary."""
    system = {"role": "system", "content": "You are the Chatfleet demo assistant."}
    turn1 = {
        "messages": [system, {"role": "user", "content": "Hello! What can you do?"}],
        "max_tokens": 24,
        "session_id": session_id,
    }
    out(f"user> {turn1['messages'][1]['content']}")
    status, body = post_json(f"{api_url}/v1/chat/completions", turn1)
    reply1 = body["choices"][0]["message"]["content"]
    out(
        f"assistant> {reply1!r}  [{status}, {body['usage']['completion_tokens']} tokens, history={body['chatfleet']['history']}]"
    )
    turn2 = {
        "messages": [system, {"role": "user", "content": "And what did I just ask you?"}],
        "max_tokens": 24,
        "session_id": session_id,
    }
    history = body["chatfleet"]["history"]
    where = "history from Redis" if history == "ok" else "no session store reached: this turn sees no history"
    out(f"user> {turn2['messages'][1]['content']}  (streamed; {where})")
    reply2, ttft, chunks = _stream(api_url, turn2)
    out(f"assistant> {reply2!r}  [first text after {ttft * 1000:.0f} ms, {chunks} SSE chunks]")
    bad_status, bad = post_json(
        f"{api_url}/v1/chat/completions", {"messages": [{"role": "robot", "content": "beep"}]}
    )
    out(f"bad request -> {bad_status}: {bad['error']['message']}")
    return {"reply1": reply1, "reply2": reply2, "ttft_s": ttft, "bad_status": bad_status}


def run_demo(workdir: Path, out: Callable[[str], None] = print) -> dict:
    """Start the local runtime, run chat_exchange, stop everything."""
    out("starting the runtime (tiny random model, Redis, tritonserver, chat API) ...")
    with local_runtime(Path(workdir)) as rt:
        out(f"CHAT_API={rt.api_url}")
        return chat_exchange(rt.api_url, out)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=".work/runtime-demo")
    parser.add_argument("--api-url", help="use a running chat API instead of starting one")
    args = parser.parse_args(argv)
    if args.api_url:
        chat_exchange(args.api_url)
    else:
        run_demo(Path(args.workdir).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
