"""A fake moat-gateway for the SDK's unit tests: http.server in a thread
that records every request (method, path, headers, JSON body; for the
REST files route, "PUT files" / "GET files" with the raw body) and answers
from a per-method script. Not for: behaviour of the real gateway beyond
the reply shapes the tests choose."""

from __future__ import annotations

import json
import threading
from urllib.parse import parse_qs
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Tuple, Union

Answer = Union[Tuple[int, Any], Callable[[dict], Tuple[int, Any]]]


class FakeGateway:
    def __init__(self):
        self.requests: List[Dict[str, Any]] = []
        # method name -> list of answers, used in order (the last repeats)
        self.script: Dict[str, List[Answer]] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                method = self.path.rsplit("/", 1)[-1]
                fake.requests.append({"method": method, "path": self.path,
                                      "headers": dict(self.headers),
                                      "body": body})
                answers = fake.script.get(method) or [(200, {})]
                ans = answers.pop(0) if len(answers) > 1 else answers[0]
                status, reply = ans(body) if callable(ans) else ans
                data = (reply if isinstance(reply, bytes)
                        else json.dumps(reply).encode())
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (timeout tests)

            def _route(self):
                # REST routes (the files route's archive form): the
                # script's name is "PUT files" / "GET files"; the body is
                # kept raw; an answer may add headers as a third item.
                path, _, query = self.path.partition("?")
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                method = self.command + " " + path.rsplit("/", 1)[-1]
                fake.requests.append({"method": method, "path": path,
                                      "query": parse_qs(query),
                                      "headers": dict(self.headers),
                                      "body": raw})
                answers = fake.script.get(method) or [(200, {})]
                ans = answers.pop(0) if len(answers) > 1 else answers[0]
                ans = ans(raw) if callable(ans) else ans
                status, reply = ans[0], ans[1]
                extra = ans[2] if len(ans) > 2 else {}
                binary = isinstance(reply, bytes)
                data = reply if binary else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-tar"
                                 if binary else "application/json")
                self.send_header("Content-Length",
                                 extra.get("Content-Length",
                                           str(len(data))))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_PUT = _route
            do_GET = _route

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       args=(0.02,),
                                       daemon=True)
        self.thread.start()

    def on(self, method: str, *answers: Answer) -> None:
        self.script[method] = list(answers)

    def calls(self, method: str) -> List[Dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
