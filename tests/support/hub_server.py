"""
`LocalHub`: an in-process HTTP server on 127.0.0.1 implementing the part of the Hugging Face Hub API that
huggingface_hub (and so transformers and realm-hf) calls, for the tests of tests/hub/.

What it implements, with the behaviour the clients rely on:

- repos and branches (`/api/repos/create`, `/api/{type}s/{id}/branch/{rev}`), repo info and tree listing (LFS files
  listed with their `lfs` oid and size, like the Hub), card YAML validation (`/api/validate-yaml`, accepts all);
- uploads: `preupload` answers `lfs` for what the Hub stores in LFS (a binary sample, a size over 10 MB, or a suffix
  of the Hub's default `.gitattributes`), `regular` otherwise; `regular` files come inline in the commit, LFS files go
  through the Git LFS batch API (`POST {repo}.git/info/lfs/objects/batch`, basic transfer), a `PUT` to a storage
  URL on a second server (the Hub's S3: another origin, no Authorization header expected), and the `verify` call;
  the commit then names them as `lfsFile` entries, refused unless the object was uploaded and verified;
- downloads (`resolve`): regular files with `X-Repo-Commit`/`ETag`; LFS files as a 302 to the storage server with
  `X-Linked-Etag` (the sha256) and `X-Linked-Size`, which huggingface_hub reads before following the redirect;
  missing files and revisions as 404 with `X-Error-Code` (`EntryNotFound` with the commit, so clients can cache the
  absence);
- auth: every write call (repo/branch creation, preupload, LFS batch and verify, commit) must carry
  `Authorization: Bearer <token>`; others get 401 and are recorded in `unauthorized`.

Not implemented: Xet storage (huggingface_hub uploads through Xet whenever `hf_xet` is installed, which
huggingface_hub 1.x/2.x requires, so tests turn it off with `HF_HUB_DISABLE_XET`; the LFS path here is what the
client takes then, or for buffered IO), multipart LFS uploads (only for objects over the chunk size the server
names), pull requests, rate limits. Storage is in memory; each commit keeps a full map of the repo's files.
"""

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

# Suffixes of the Hub's default .gitattributes (the files it stores in LFS whatever their content).
LFS_SUFFIXES = (
    ".7z .arrow .bin .bz2 .ckpt .ftz .gz .h5 .joblib .mlmodel .model .msgpack .npy .npz .onnx .ot .parquet .pb "
    ".pickle .pkl .pt .pth .rar .safetensors .tar .tflite .tgz .wasm .xz .zip .zst"
).split()
LFS_MIN_SIZE = 10 * 1000 * 1000
TOKEN = "hf_local_test_token"


@dataclass(frozen=True)
class LfsFile:
    """A file stored in LFS: the commit holds its pointer, the object store its content."""

    oid: str  # sha256 of the content
    size: int


def point_clients_at(monkeypatch, endpoint: str, cache_dir: str) -> None:
    """
    Point huggingface_hub (and so transformers and realm-hf) at a Hub-compatible server, online, with the cache
    `cache_dir`; `monkeypatch` undoes it (tests/conftest.py keeps everything else offline).
    """
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", cache_dir)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    # transformers keeps one HfApi, made with the endpoint of its first use: let it make one for this server.
    monkeypatch.setattr("transformers.utils.hub._hf_api", None)
    # With hf_xet installed (huggingface_hub requires it) transfers take the Xet path, which these servers do not
    # serve; without Xet the client takes the Git LFS path.
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def should_use_lfs(path: str, size: int, sample: bytes) -> bool:
    """The Hub's rule, as far as clients can see it: LFS for known binary suffixes, big files and binary content."""
    return path.endswith(tuple(LFS_SUFFIXES)) or size >= LFS_MIN_SIZE or b"\0" in sample


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub = None  # set on the subclass each server gets

    def log_message(self, *args):
        pass

    def _send(self, status, body=b"", headers=None, content_type="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status, code, headers=None):
        self._send(status, {"error": code}, {"X-Error-Code": code, "X-Error-Message": code, **(headers or {})})

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


class LocalHub:
    """
    The Hub API subset described in the module docstring, on two local servers: the Hub (`url`) and its LFS storage
    (`storage_url`, a different origin, as S3/the CDN are for the Hub). Use as a context manager.

    Records: `log` (every `(method, path)` the Hub server got), `lfs_uploads` (`(oid, size)` of each verified upload),
    `storage_log` (`(method, path, had_authorization_header)` on the storage server), `unauthorized` (write calls
    refused for a missing or wrong token).
    """

    def __init__(self, token=TOKEN):
        self.token = token
        self.repos = {}  # (type, repo_id) -> {"branches": {name: sha}, "commits": {sha: {path: bytes | LfsFile}}}
        self.objects = {}  # sha256 -> content of verified LFS objects
        self.pending = {}  # sha256 -> content PUT to storage, not verified yet
        self.log, self.lfs_uploads, self.storage_log, self.unauthorized = [], [], [], []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), type("HubHandler", (_HubHandler,), {"hub": self}))
        self.storage = ThreadingHTTPServer(("127.0.0.1", 0), type("StorageHandler", (_StorageHandler,), {"hub": self}))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.storage_url = f"http://127.0.0.1:{self.storage.server_address[1]}"
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.server, self.storage)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        for server in (self.server, self.storage):
            server.shutdown()
            server.server_close()

    # -- storage ----------------------------------------------------------------------------------------------------

    def _create(self, repo_type, repo_id):
        key = (repo_type, repo_id)
        if key not in self.repos:
            sha = hashlib.sha1(f"{repo_type}/{repo_id}/init".encode()).hexdigest()
            self.repos[key] = {"branches": {"main": sha}, "commits": {sha: {}}}
        return self.repos[key]

    def _resolve(self, repo, revision):
        revision = unquote(revision)
        if revision in repo["branches"]:
            return repo["branches"][revision]
        if revision in repo["commits"]:
            return revision
        return None

    def files(self, repo_id, repo_type="model", revision="main"):
        """`{path: bytes | LfsFile}` of a repo at `revision`."""
        repo = self.repos[(repo_type, repo_id)]
        return repo["commits"][self._resolve(repo, revision)]

    def content(self, value) -> bytes:
        return self.objects[value.oid] if isinstance(value, LfsFile) else value


class _StorageHandler(_Handler):
    """The Hub's object storage: takes the LFS upload PUTs and serves LFS content (what the CDN does)."""

    def _record(self):
        self.hub.storage_log.append((self.command, urlparse(self.path).path, "Authorization" in self.headers))

    def do_PUT(self):
        self._record()
        m = re.fullmatch(r"/upload/([0-9a-f]{64})", urlparse(self.path).path)
        if not m:
            return self._error(404, "NotFound")
        self.hub.pending[m.group(1)] = self._body()
        self._send(200, b"", {"ETag": '"stored"'})

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self._record()
        m = re.fullmatch(r"/objects/([0-9a-f]{64})", urlparse(self.path).path)
        if not m or m.group(1) not in self.hub.objects:
            return self._error(404, "NotFound")
        self._send(200, self.hub.objects[m.group(1)], content_type="application/octet-stream")


class _HubHandler(_Handler):
    def _repo(self, repo_type, repo_id):
        repo = self.hub.repos.get((repo_type, repo_id))
        if repo is None:
            self._error(404, "RepoNotFound")
        return repo

    def _authorized(self):
        if self.headers.get("Authorization") == f"Bearer {self.hub.token}":
            return True
        self.hub.unauthorized.append((self.command, self.path))
        self._error(401, "Invalid credentials in Authorization header")
        return False

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        hub = self.hub
        path = urlparse(self.path).path
        hub.log.append((self.command, self.path))
        m = re.fullmatch(r"/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            repo_type = "dataset" if m.group(1) else "model"
            repo = self._repo(repo_type, m.group(2))
            if repo is None:
                return
            sha = hub._resolve(repo, m.group(3))
            if sha is None:
                return self._error(404, "RevisionNotFound")
            filename = unquote(m.group(4))
            files = repo["commits"][sha]
            if filename not in files:
                # Like the Hub: the commit comes along, so clients can cache that the file does not exist.
                return self._error(404, "EntryNotFound", {"X-Repo-Commit": sha})
            value = files[filename]
            if isinstance(value, LfsFile):
                # Like the Hub: a redirect to storage, with the object's sha256 and size on the redirect itself.
                headers = {
                    "Location": f"{hub.storage_url}/objects/{value.oid}",
                    "X-Repo-Commit": sha,
                    "X-Linked-Etag": f'"{value.oid}"',
                    "X-Linked-Size": str(value.size),
                    "ETag": f'"{git_blob_sha(hub.content(value))}"',
                }
                return self._send(302, b"", headers)
            etag = git_blob_sha(value)
            return self._send(200, value, {"X-Repo-Commit": sha, "ETag": f'"{etag}"'}, "application/octet-stream")
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            repo = self._repo(m.group(1)[:-1], m.group(2))
            if repo is None:
                return
            sha = hub._resolve(repo, m.group(3) or "main")
            if sha is None:
                return self._error(404, "RevisionNotFound")
            siblings = [{"rfilename": p} for p in sorted(repo["commits"][sha])]
            return self._send(200, {"id": m.group(2), "sha": sha, "siblings": siblings, "private": False})
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m:
            repo = self._repo(m.group(1)[:-1], m.group(2))
            if repo is None:
                return
            sha = hub._resolve(repo, m.group(3))
            prefix = unquote(m.group(4) or "").strip("/")
            entries = []
            for p, value in sorted(repo["commits"][sha].items()):
                if prefix and not p.startswith(prefix + "/"):
                    continue
                data = hub.content(value)
                entry = {"type": "file", "path": p, "size": len(data), "oid": git_blob_sha(data)}
                if isinstance(value, LfsFile):
                    entry["lfs"] = {"oid": value.oid, "size": value.size, "pointerSize": 134}
                entries.append(entry)
            return self._send(200, entries)
        self._error(404, "NotFound")

    def do_POST(self):
        hub = self.hub
        path = urlparse(self.path).path
        hub.log.append((self.command, self.path))
        body = self._body()
        if path == "/api/validate-yaml":
            return self._send(200, {"errors": [], "warnings": []})
        if not self._authorized():
            return
        if path == "/api/repos/create":
            payload = json.loads(body)
            repo_type = payload.get("type") or "model"
            repo_id = f"{payload['organization']}/{payload['name']}"
            hub._create(repo_type, repo_id)
            prefix = "datasets/" if repo_type == "dataset" else ""
            return self._send(200, {"url": f"{hub.url}/{prefix}{repo_id}", "name": repo_id})
        m = re.fullmatch(r"/(?:(datasets)/)?([^/]+/[^/]+)\.git/info/lfs/objects/(batch|verify)", path)
        if m:
            repo = self._repo("dataset" if m.group(1) else "model", m.group(2))
            if repo is None:
                return
            return self._lfs_batch(m.group(0), json.loads(body)) if m.group(3) == "batch" else self._lfs_verify(body)
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/(preupload|commit|branch)/([^/]+)", path)
        if not m:
            return self._error(404, "NotFound")
        repo = self._repo(m.group(1)[:-1], m.group(2))
        if repo is None:
            return
        action, revision = m.group(3), unquote(m.group(4))
        if action == "branch":
            repo["branches"].setdefault(revision, repo["branches"]["main"])
            return self._send(200, {})
        sha = hub._resolve(repo, revision)
        if sha is None:
            return self._error(404, "RevisionNotFound")
        if action == "preupload":
            modes = []
            for f in json.loads(body)["files"]:
                lfs = should_use_lfs(f["path"], f["size"], base64.b64decode(f["sample"]))
                modes.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False})
            return self._send(200, {"files": modes, "commitOid": sha})
        return self._commit(repo, sha, revision, m.group(2), body)

    def _lfs_batch(self, batch_path, payload):
        hub = self.hub
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            return self._error(400, "UnsupportedLfsOperation")
        objects = []
        for obj in payload["objects"]:
            oid, size = obj["oid"], obj["size"]
            if oid in hub.objects:
                objects.append({"oid": oid, "size": size})  # already stored: no actions, the client skips it
                continue
            verify = f"{hub.url}{batch_path.rsplit('/', 1)[0]}/verify"
            actions = {
                "upload": {"href": f"{hub.storage_url}/upload/{oid}", "header": {}},
                "verify": {"href": verify, "header": {}},
            }
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": actions})
        return self._send(200, {"transfer": "basic", "objects": objects}, content_type="application/vnd.git-lfs+json")

    def _lfs_verify(self, body):
        hub = self.hub
        payload = json.loads(body)
        oid, size = payload["oid"], payload["size"]
        data = hub.pending.pop(oid, None)
        if data is None or hashlib.sha256(data).hexdigest() != oid or len(data) != size:
            return self._error(422, "LfsVerifyFailed")
        hub.objects[oid] = data
        hub.lfs_uploads.append((oid, size))
        return self._send(200, {})

    def _commit(self, repo, sha, revision, repo_id, body):
        hub = self.hub
        files = dict(repo["commits"][sha])
        for line in body.decode().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "lfsFile":
                if value["oid"] not in hub.objects:
                    return self._error(422, "LfsObjectNotFound")
                files[value["path"]] = LfsFile(value["oid"], len(hub.objects[value["oid"]]))
            elif item["key"] == "deletedFile":
                files.pop(value["path"], None)
            elif item["key"] == "deletedFolder":
                for p in [p for p in files if p.startswith(value["path"].rstrip("/") + "/")]:
                    del files[p]
            elif item["key"] != "header":
                return self._error(400, f"Unsupported{item['key']}")
        new = hashlib.sha1(
            json.dumps(sorted((p, git_blob_sha(hub.content(d))) for p, d in files.items())).encode() + sha.encode()
        ).hexdigest()
        repo["commits"][new] = files
        repo["branches"][revision if revision in repo["branches"] else "main"] = new
        return self._send(
            200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{new}", "commitOid": new, "pullRequestUrl": None}
        )
