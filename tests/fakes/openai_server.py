"""A fake OpenAI-compatible chat server on loopback: scripted replies over real HTTP, for tests.

Each POST to ``/v1/chat/completions`` takes the next scripted reply (a completion, an error status
with optional headers, or a stall longer than the client's timeout) and is recorded with its
headers and JSON body. When the script runs out the server answers 500 with a message saying so,
so a test that asks more than it scripted fails loudly.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Scripted:
    status: int = 200
    body: dict = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # wait this long before answering (a timeout when above the client's)


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict

    @property
    def messages(self) -> list[dict]:
        return self.body.get("messages", [])

    @property
    def text(self) -> str:
        """All message contents joined: what the model was shown."""
        return "\n".join(m.get("content", "") for m in self.messages)


def chat_reply(content: str, *, prompt_tokens: int = 1200, completion_tokens: int = 800,
               model: str = "fake-model", finish_reason: str = "stop",
               usage: bool = True) -> Scripted:
    body = {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": finish_reason,
                     "message": {"role": "assistant", "content": content}}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + completion_tokens}
    return Scripted(body=body)


def error_reply(status: int, message: str = "fake failure", headers: dict[str, str] | None = None,
                ) -> Scripted:
    return Scripted(status=status, headers=headers or {},
                    body={"error": {"message": message, "type": "fake_error", "code": None}})


def stall(seconds: float) -> Scripted:
    """Answer only after ``seconds``: longer than the client's timeout, the client gives up first."""
    return Scripted(delay_s=seconds, body=chat_reply("too late").body)


class FakeOpenAIServer:
    """Serve scripted chat completions on 127.0.0.1 at an ephemeral port until stopped."""

    def __init__(self, *script: Scripted) -> None:
        self._script: deque[Scripted] = deque(script)
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def add(self, *replies: Scripted) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        return len(self._script)

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases stalled handlers at once
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _next(self, request: Recorded) -> Scripted:
        with self._lock:
            self.requests.append(request)
            if self._script:
                return self._script.popleft()
        return error_reply(500, "the fake server has no scripted reply left")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                recorded = Recorded(self.path, {k.lower(): v for k, v in self.headers.items()},
                                    json.loads(raw or b"{}"))
                reply = (server._next(recorded) if self.path == CHAT_PATH
                         else error_reply(404, f"no route {self.path}"))
                if reply.delay_s and server._stopping.wait(reply.delay_s):
                    return
                payload = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test): nothing to answer

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep test output quiet

        return Handler
