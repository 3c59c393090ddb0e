"""The gateway's side of ext_proc, for the picker's tests: one exchange as Envoy has it (the request's
headers, then its buffered body), answered with the picker's destination header. It plays a gateway that
does not allow mode overrides: the body is sent even when the picker answered at the headers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from envoy_data_plane.envoy.config.core.v3 import HeaderMap, HeaderValue
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    ExternalProcessorAsyncStub,
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
)
from grpclib.client import Channel

BODY = b'{"messages": [{"role": "user", "content": "hello"}]}'


async def destination(stub: ExternalProcessorAsyncStub, session: str, body: bytes = BODY) -> str:
    """The x-gateway-destination-endpoint the picker sets for one request of `session` ('' if none)."""
    headers = HttpHeaders(
        headers=HeaderMap(headers=[HeaderValue(key="x-session-id", raw_value=session.encode())])
    )

    async def requests():
        yield ProcessingRequest(request_headers=headers)
        yield ProcessingRequest(request_body=HttpBody(body=body, end_of_stream=True))

    answers = [a async for a in stub.process(requests())]
    assert len(answers) == 2, answers  # one answer to each message
    set_headers = [
        h
        for a in answers
        for phase in (a.request_headers, a.request_body)
        if phase is not None and phase.response and phase.response.header_mutation
        for h in phase.response.header_mutation.set_headers
    ]
    assert len(set_headers) <= 1, set_headers  # the destination is set once, at the headers or the body
    return "".join(h.header.raw_value.decode() for h in set_headers)


async def destinations(port: int, sessions: Iterable[str]) -> list[str]:
    """One exchange per session, in order, on one channel to the picker's port."""
    channel = Channel("127.0.0.1", port)
    try:
        stub = ExternalProcessorAsyncStub(channel)
        return [await destination(stub, s) for s in sessions]
    finally:
        channel.close()


def ask(port: int, session: str) -> str:
    """One exchange on a channel of its own."""
    return asyncio.run(destinations(port, [session]))[0]
