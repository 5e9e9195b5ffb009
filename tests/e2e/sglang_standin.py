"""An HTTP stand-in for one SGLang 0.5.23 server, for the router's e2e tests.

Faked: the engine. It answers the endpoints SGLang's model gateway (smg 1.13.0) calls with the
bodies real SGLang 0.5.23 answered (``tests/fixtures/sglang-http``, captured by its
``capture.py``), on its own loopback address (127.0.0.<n>) and the CR's engine port, the way a pod
answers on its pod IP. ``ready = False`` makes ``/ready`` and ``/health`` answer 503 as SGLang
does while it cannot serve. ``/generate`` answers a minimal body and counts requests, so a test
can see which pod the router chose, and records each request's ``text`` (``texts``);
``/metrics`` serves a real SGLang page when given one. ``waiting`` and ``token_usage`` are the
load it reports on ``/v1/loads`` (SGLang's ``num_waiting_reqs`` and ``token_usage`` of its one
dp rank), so a test can make it look busy to the router. The pod tier runs the router in front
of real servers.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-http"


def _answers() -> dict[str, tuple[int, Any]]:
    out = {}
    for path in FIXTURES.glob("*.json"):
        data = json.loads(path.read_text())
        out[data["path"].split("?")[0]] = (int(data["status"]), data["body"])
    return out


class SGLangStandIn:
    def __init__(self, ip: str, port: int, metrics_page: Path | None = None) -> None:
        """``metrics_page``: a real SGLang ``/metrics`` page (tests/fixtures/sglang-metrics)
        served as it is."""
        self.ip, self.port = ip, port
        metrics = metrics_page.read_bytes() if metrics_page is not None else b""
        self.ready = True
        self.generate_requests = 0
        self.paths: list[str] = []
        self.texts: list[str] = []
        self.waiting = 0
        self.token_usage = 0.0
        answers = _answers()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                owner.paths.append(path)
                if path == "/metrics" and metrics:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(metrics)))
                    self.end_headers()
                    self.wfile.write(metrics)
                    return
                if path in ("/ready", "/health", "/health_generate") and not owner.ready:
                    self._send(503, {"status": "not ready"})
                    return
                status, body = answers.get(path, (404, {"detail": "Not Found"}))
                if path == "/v1/loads" and status == 200:
                    body = owner._loads(body)
                self._send(status, body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                path = self.path.split("?")[0]
                owner.paths.append(path)
                if path == "/generate":
                    owner.generate_requests += 1
                    owner.texts.append(str(json.loads(raw or b"{}").get("text", "")))
                    self._send(200, {"text": " ok", "meta_info": {
                        "prompt_tokens": 8, "completion_tokens": 1, "cached_tokens": 0}})
                    return
                self._send(404, {"detail": "Not Found"})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((ip, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _loads(self, body: dict[str, Any]) -> dict[str, Any]:
        """The captured ``/v1/loads`` answer with this stand-in's queue and KV usage."""
        loads = [{**load, "num_waiting_reqs": self.waiting, "token_usage": self.token_usage,
                  "queues": {**load.get("queues", {}), "waiting": self.waiting},
                  "num_used_tokens": int(self.token_usage * load.get("max_total_num_tokens", 0))}
                 for load in body.get("loads", [])]
        return {**body, "loads": loads}

    def load_polls(self) -> int:
        """How often the router asked for this server's load."""
        return sum(1 for p in self.paths if p == "/v1/loads")

    def __enter__(self) -> SGLangStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
