"""A local stand-in for the few Hub HTTP endpoints a push uses, for huggingface_hub's HF_ENDPOINT.

Who a token is, repository creation, branch creation, the README metadata check, the preupload check (every
file answered as a regular git file, sent inline with the commit) and commits; everything received is kept in memory so
that tests can read what was pushed, where, and with which credentials.
"""

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import yaml

REPO = r"/api/models/(?P<repo>[^/]+/[^/]+)"


class HubStandIn:
    def __init__(self):
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}  # repo -> revision -> path -> content
        self.requests: list[tuple[str, str, str]] = []  # method, path, authorization header
        self.unknown: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stand_in.requests.append(("GET", self.path, self.headers.get("authorization", "")))
                if self.path.split("?")[0] == "/api/whoami-v2":  # who the token is: asked before a run pushes
                    return self._reply(200, {"type": "user", "name": "user", "orgs": []})
                stand_in.unknown.append(f"GET {self.path}")
                self._reply(404, {"error": "not found"})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                stand_in.requests.append(("POST", self.path, self.headers.get("authorization", "")))
                path = unquote(self.path.split("?")[0])
                for pattern, handle in stand_in.routes:
                    if m := re.fullmatch(pattern, path):
                        return self._reply(200, handle(body, **m.groupdict()))
                stand_in.unknown.append(f"POST {path}")
                self._reply(404, {"error": "not found"})

            def _reply(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.routes = [
            (r"/api/repos/create", self._create),
            (r"/api/validate-yaml", self._validate_yaml),
            (REPO + r"/preupload/(?P<revision>.+)", self._preupload),
            (REPO + r"/commit/(?P<revision>.+)", self._commit),
            (REPO + r"/branch/(?P<branch>.+)", self._branch),
        ]
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()

    def _create(self, body, **_):
        request = json.loads(body)
        repo = f"{request.get('organization') or 'user'}/{request['name']}"
        self.repos.setdefault(repo, {"main": {}})
        return {"url": f"{self.url}/{repo}"}

    def _validate_yaml(self, body, **_):
        # The Hub checks a README's metadata block before a commit; here it must at least parse.
        content = json.loads(body)["content"]
        yaml.safe_load(content.split("---")[1])
        return {"errors": [], "warnings": []}

    def _preupload(self, body, repo, revision):
        files = json.loads(body)["files"]
        return {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}

    def _commit(self, body, repo, revision):
        files = self.repos.setdefault(repo, {}).setdefault(revision, {})
        for line in body.decode().splitlines():
            entry = json.loads(line)
            if entry["key"] == "file":
                files[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
        oid = hashlib.sha1(body).hexdigest()
        return {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid}

    def _branch(self, body, repo, branch):
        revisions = self.repos.setdefault(repo, {"main": {}})
        revisions.setdefault(branch, dict(revisions.get("main", {})))
        return {}
