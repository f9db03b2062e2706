"""The PR comment poster against a real local HTTP server speaking GitHub's three endpoints."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from harness.gate import github

TOKEN = "ghp_TESTtoken0123456789abcdefSECRET"
REPO = "octo/specdec"
PR = 7


class FakeGitHub:
    """Issue comments of one PR: list (paginated, Link header), create, update."""

    def __init__(self):
        self.comments: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.auth: set[str] = set()
        self.fail_with: int | None = None
        self.next_id = 1000

    def add(self, body: str, user: str = "someone") -> dict:
        self.next_id += 1
        c = {"id": self.next_id, "body": body, "user": {"login": user},
             "html_url": f"https://github.test/{REPO}/pull/{PR}#issuecomment-{self.next_id}"}
        self.comments.append(c)
        return c


@pytest.fixture
def server():
    state = FakeGitHub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest output clean
            pass

        def _reply(self, code: int, payload, headers=None):
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _guard(self) -> bool:
            state.requests.append((self.command, self.path))
            state.auth.add(self.headers.get("Authorization", ""))
            if state.fail_with:
                self._reply(state.fail_with, {"message": "Bad credentials"})
                return False
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._reply(401, {"message": "Requires authentication"})
                return False
            return True

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length", 0))
            return json.loads(self.rfile.read(n) or b"{}")

        def do_GET(self):
            if not self._guard():
                return
            url = urlparse(self.path)
            if url.path != f"/repos/{REPO}/issues/{PR}/comments":
                return self._reply(404, {"message": "Not Found"})
            q = parse_qs(url.query)
            per_page, page = int(q.get("per_page", ["30"])[0]), int(q.get("page", ["1"])[0])
            chunk = state.comments[(page - 1) * per_page: page * per_page]
            headers = {}
            if page * per_page < len(state.comments):
                base = f"http://127.0.0.1:{self.server.server_port}{url.path}"
                headers["Link"] = f'<{base}?per_page={per_page}&page={page + 1}>; rel="next"'
            self._reply(200, chunk, headers)

        def do_POST(self):
            if not self._guard():
                return
            if urlparse(self.path).path != f"/repos/{REPO}/issues/{PR}/comments":
                return self._reply(404, {"message": "Not Found"})
            self._reply(201, state.add(self._body()["body"], "github-actions[bot]"))

        def do_PATCH(self):
            if not self._guard():
                return
            m = re.fullmatch(rf"/repos/{REPO}/issues/comments/(\d+)", urlparse(self.path).path)
            found = [c for c in state.comments if m and c["id"] == int(m.group(1))]
            if not found:
                return self._reply(404, {"message": "Not Found"})
            found[0]["body"] = self._body()["body"]
            self._reply(200, found[0])

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_port}"
    yield state
    httpd.shutdown()
    httpd.server_close()


def ours(state: FakeGitHub) -> list[dict]:
    return [c for c in state.comments if github.MARKER in c["body"]]


def test_creates_then_updates_one_comment(server):
    first = github.post_or_update(REPO, PR, "### gate: 1 regressed", token=TOKEN, api_url=server.url)
    assert first.action == "created"
    second = github.post_or_update(REPO, PR, "### gate: all clear", token=TOKEN, api_url=server.url)
    assert second.action == "updated" and second.comment_id == first.comment_id
    assert len(ours(server)) == 1 and len(server.comments) == 1
    assert ours(server)[0]["body"] == f"{github.MARKER}\n### gate: all clear"
    assert server.auth == {f"Bearer {TOKEN}"}
    methods = [m for m, _ in server.requests]
    assert methods == ["GET", "POST", "GET", "PATCH"]


def test_finds_its_comment_on_a_later_page(server):
    for i in range(120):
        server.add(f"comment {i} by a human")
    mine = server.add(f"{github.MARKER}\nold report")
    server.add("a later human comment")
    posted = github.post_or_update(REPO, PR, "new report", token=TOKEN, api_url=server.url)
    assert posted.action == "updated" and posted.comment_id == mine["id"]
    assert len(ours(server)) == 1 and len(server.comments) == 122
    gets = [p for m, p in server.requests if m == "GET"]
    assert len(gets) == 2 and "page=2" in gets[1]     # followed the Link header


def test_errors_never_show_the_token(server):
    server.fail_with = 401
    with pytest.raises(github.GitHubError) as e:
        github.post_or_update(REPO, PR, "body", token=TOKEN, api_url=server.url)
    assert "HTTP 401" in str(e.value) and "Bad credentials" in str(e.value)
    assert TOKEN not in str(e.value)
    with pytest.raises(github.GitHubError, match="GITHUB_TOKEN is not set"):
        github.post_or_update(REPO, PR, "body", token="", api_url=server.url)
    with pytest.raises(github.GitHubError, match="OWNER/NAME"):
        github.post_or_update("not a repo", PR, "body", token=TOKEN, api_url=server.url)


def test_unreachable_api_is_one_line_without_token():
    with pytest.raises(github.GitHubError) as e:
        github.post_or_update(REPO, PR, "body", token=TOKEN, api_url="http://127.0.0.1:9")
    assert TOKEN not in str(e.value) and "\n" not in str(e.value)


def test_command_line_reads_env_and_event_and_never_prints_the_token(server, tmp_path, monkeypatch, capsys):
    body = tmp_path / "report.md"
    body.write_text("### gate passed\n")
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": PR}}))
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    assert github.main(["--body-file", str(body), "--api-url", server.url]) == 0
    assert github.main(["--body-file", str(body), "--api-url", server.url]) == 0
    out = capsys.readouterr()
    assert "PR comment created" in out.out and "PR comment updated" in out.out
    assert len(ours(server)) == 1
    server.fail_with = 403
    assert github.main(["--body-file", str(body), "--api-url", server.url]) == 2
    out = capsys.readouterr()
    assert "HTTP 403" in out.err
    assert TOKEN not in out.out + out.err


def test_gate_posts_its_report_as_the_comment(server, tmp_path, monkeypatch):
    import textwrap

    from typer.testing import CliRunner

    from harness.cli import app
    from harness.protocol.params import cell_id, cell_label
    from harness.sweep.journal import RunJournal
    from harness.sweep.scenario import parse_scenario

    text = textwrap.dedent("""\
        name: gate-comment
        defaults: {model: tiny, device: cpu, repeats: 5, profile_steps: 0}
        matrix:
          context_length: [64]
        """)
    (tmp_path / "s.yaml").write_text(text)
    sc = parse_scenario(text, "s.yaml")
    for run_id, tps in (("20260101-000000-000001", 100.0), ("20260101-000000-000002", 90.0)):
        j = RunJournal.create(tmp_path / "runs", run_id, sc.name, "s.yaml", text, sc.cells(), {})
        for cell in sc.cells():
            j.write_cell({"cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell),
                          "status": "ok", "metrics": {"tokens_per_s": tps},
                          "samples": {"tokens_per_s": [tps * f for f in (0.99, 1.0, 1.01, 0.995, 1.005)]},
                          "env": {"gpu": None}})
    env = {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": server.url, "GITHUB_REPOSITORY": REPO,
           "COLUMNS": "200"}
    args = ["gate", str(tmp_path / "s.yaml"), "--baseline", "run:20260101-000000-000001",
            "--run", "20260101-000000-000002", "--results", str(tmp_path), "--comment", "--pr", str(PR)]
    r = CliRunner().invoke(app, args, env=env)
    assert r.exit_code == 1, r.output              # the regression decides the exit code
    assert "PR comment created" in r.output
    r = CliRunner().invoke(app, args, env=env)
    assert "PR comment updated" in r.output and len(ours(server)) == 1
    assert "Performance gate: regression" in ours(server)[0]["body"]
    server.fail_with = 500
    r = CliRunner().invoke(app, args, env=env)
    assert r.exit_code == 1 and "PR comment not posted" in r.output   # a warning, same verdict
    assert TOKEN not in r.output
