"""A minimal model hub for tests: the few Hugging Face Hub HTTP routes `snapshot_download` uses.

``python -m chatfleet_platform.servers.hubserver --root DIR --port N [--token T]`` serves every folder
DIR/ORG/NAME as the model repository ORG/NAME with one commit (branch ``main``), so the launcher's
``hf://`` fetcher can be run with ``HF_ENDPOINT=http://127.0.0.1:N``. Routes:
``GET /api/models/ORG/NAME/revision/REV`` (repository info), ``GET /api/models/ORG/NAME/tree/REV``
(recursive file list) and ``HEAD|GET /ORG/NAME/resolve/REV/PATH`` (a file, with X-Repo-Commit and ETag).
With --token every request must carry ``Authorization: Bearer T`` (401 otherwise, as the hub answers
for a private repository).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

INFO = re.compile(r"^/api/models/([^/]+/[^/]+)/revision/([^/]+)$")
TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?$")
RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


def _files(repo: Path) -> list[Path]:
    return sorted(p for p in repo.rglob("*") if p.is_file())


def _commit(repo: Path) -> str:
    """A 40-hex commit id from the repository's content (stable while the files do not change)."""
    h = hashlib.sha1()
    for p in _files(repo):
        h.update(str(p.relative_to(repo)).encode() + b"\0" + hashlib.sha1(p.read_bytes()).digest())
    return h.hexdigest()


class _Hub(BaseHTTPRequestHandler):
    root: Path = Path()
    token: str | None = None

    def _reply(self, code: int, body: bytes = b"", headers: dict | None = None, error: str = "") -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if error:
            self.send_header("X-Error-Code", error)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value) -> None:
        self._reply(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _repo(self, repo_id: str, revision: str) -> tuple[Path, str] | None:
        repo = (self.root / repo_id).resolve()
        if not repo.is_dir() or self.root.resolve() not in repo.parents:
            self._reply(404, b"Repository not found", error="RepoNotFound")
            return None
        commit = _commit(repo)
        if revision not in ("main", commit):
            self._reply(404, b"Revision not found", error="RevisionNotFound")
            return None
        return repo, commit

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            self._reply(401, b"Invalid credentials", error="RepoNotFound")
            return
        path = unquote(urlparse(self.path).path)
        if m := INFO.match(path):
            found = self._repo(m.group(1), m.group(2))
            if found:
                repo, commit = found
                files = [str(p.relative_to(repo)) for p in _files(repo)]
                self._json({"id": m.group(1), "sha": commit, "siblings": [{"rfilename": f} for f in files]})
        elif m := TREE.match(path):
            found = self._repo(m.group(1), m.group(2))
            if found:
                repo, _ = found
                self._json(
                    [
                        {
                            "type": "file",
                            "path": str(p.relative_to(repo)),
                            "size": p.stat().st_size,
                            "oid": hashlib.sha1(p.read_bytes()).hexdigest(),
                        }
                        for p in _files(repo)
                    ]
                )
        elif m := RESOLVE.match(path):
            found = self._repo(m.group(1), m.group(2))
            if found:
                repo, commit = found
                file = (repo / m.group(3)).resolve()
                if not file.is_file() or repo not in file.parents:
                    self._reply(404, b"Entry not found", {"X-Repo-Commit": commit}, error="EntryNotFound")
                    return
                data = file.read_bytes()
                etag = f'"{hashlib.sha1(data).hexdigest()}"'
                self._reply(200, data, {"X-Repo-Commit": commit, "ETag": etag})
        else:
            self._reply(404, b"Not found")

    def log_message(self, format, *args):
        print(format % args, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Serve --root as a model hub on 127.0.0.1:--port until terminated."""
    parser = argparse.ArgumentParser(description="minimal model hub (tests)")
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    handler = type("Hub", (_Hub,), {"root": Path(args.root), "token": args.token})
    ThreadingHTTPServer(("127.0.0.1", args.port), handler).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
