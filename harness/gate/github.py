"""Post the gate's report as ONE pull-request comment, updated in place on every push.

GitHub REST API through `requests`:
    GET   /repos/{owner}/{repo}/issues/{pr}/comments     (paginated; find ours by its marker)
    POST  /repos/{owner}/{repo}/issues/{pr}/comments     (none yet: create it)
    PATCH /repos/{owner}/{repo}/issues/comments/{id}     (found: replace its body)

The comment is recognised by a hidden HTML marker, so later runs update it instead of adding
a new one per push. The token comes from the environment (GITHUB_TOKEN) and goes only into the
Authorization header: it is never printed, logged or put in an error message (any message that
somehow contains it is redacted before it leaves this module).

    python -m harness.gate.github --body-file report.md [--repo OWNER/NAME] [--pr N]

reads the repository from GITHUB_REPOSITORY and the PR number from the Actions event
(GITHUB_EVENT_PATH) when not given.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass

MARKER = "<!-- specdec-harness:perf-gate -->"
DEFAULT_API = "https://api.github.com"
TIMEOUT_S = 30
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


class GitHubError(Exception):
    """A failed API call; the message is one line and never contains the token."""


@dataclass
class Posted:
    action: str          # "created" | "updated"
    comment_id: int
    url: str | None


def _redact(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text


def with_marker(body: str, marker: str = MARKER) -> str:
    return body if marker in body else f"{marker}\n{body}"


class _Client:
    def __init__(self, token: str, api_url: str, session=None):
        import requests

        self.token = token
        self.api = api_url.rstrip("/")
        self.session = session or requests.Session()
        self.headers = {"Authorization": f"Bearer {token}",
                        "Accept": "application/vnd.github+json",
                        "X-GitHub-Api-Version": "2022-11-28",
                        "User-Agent": "specdec-harness-gate"}

    def call(self, method: str, url: str, **kw):
        import requests

        if not url.startswith(("http://", "https://")):
            url = self.api + url
        try:
            resp = self.session.request(method, url, headers=self.headers, timeout=TIMEOUT_S, **kw)
        except requests.RequestException as e:
            # requests' messages name the URL, never headers; redact anyway.
            raise GitHubError(_redact(f"{method} {url.split('?')[0]}: {type(e).__name__}: {e}",
                                      self.token).splitlines()[0]) from None
        if resp.status_code >= 400:
            try:
                why = resp.json().get("message", "")
            except ValueError:
                why = resp.text[:200]
            raise GitHubError(_redact(f"{method} {url.split('?')[0]}: HTTP {resp.status_code} "
                                      f"{why}".strip(), self.token).replace("\n", " "))
        return resp


def find_comment(client: _Client, repo: str, pr: int, marker: str = MARKER) -> dict | None:
    """The first comment on the PR whose body carries `marker`, following pagination."""
    url = f"/repos/{repo}/issues/{pr}/comments?per_page=100"
    while url:
        resp = client.call("GET", url)
        for comment in resp.json():
            if marker in (comment.get("body") or ""):
                return comment
        url = resp.links.get("next", {}).get("url")
    return None


def post_or_update(repo: str, pr: int, body: str, *, token: str | None = None,
                   api_url: str | None = None, marker: str = MARKER, session=None) -> Posted:
    """Create the PR comment, or update the one already carrying `marker`."""
    token = token if token is not None else os.environ.get("GITHUB_TOKEN", "")
    if not token:
        raise GitHubError("GITHUB_TOKEN is not set: cannot post the PR comment")
    if not _REPO.fullmatch(repo or ""):
        raise GitHubError(f"repository must be OWNER/NAME, not {repo!r}")
    if not isinstance(pr, int) or pr <= 0:
        raise GitHubError(f"pull request number must be a positive integer, not {pr!r}")
    client = _Client(token, api_url or os.environ.get("GITHUB_API_URL") or DEFAULT_API, session)
    body = with_marker(body, marker)
    existing = find_comment(client, repo, pr, marker)
    if existing is not None:
        resp = client.call("PATCH", f"/repos/{repo}/issues/comments/{existing['id']}",
                           json={"body": body})
        action = "updated"
    else:
        resp = client.call("POST", f"/repos/{repo}/issues/{pr}/comments", json={"body": body})
        action = "created"
    data = resp.json()
    return Posted(action, int(data["id"]), data.get("html_url"))


def pr_from_event(path: str | None = None) -> int | None:
    """The pull request number of the GitHub Actions event being handled, if any."""
    path = path or os.environ.get("GITHUB_EVENT_PATH")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            event = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    number = (event.get("pull_request") or {}).get("number") or event.get("number")
    return int(number) if isinstance(number, int) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.gate.github",
                                 description="Post or update the perf-gate PR comment.")
    ap.add_argument("--body-file", required=True)
    ap.add_argument("--repo", default=os.environ.get("GITHUB_REPOSITORY"))
    ap.add_argument("--pr", type=int, default=None)
    ap.add_argument("--api-url", default=None)
    args = ap.parse_args(argv)
    try:
        with open(args.body_file, encoding="utf-8") as f:
            body = f.read()
        pr = args.pr or pr_from_event()
        if pr is None:
            raise GitHubError("no pull request number: give --pr N (or run in a pull_request event)")
        posted = post_or_update(args.repo or "", pr, body, api_url=args.api_url)
    except (GitHubError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"PR comment {posted.action}: {posted.url or posted.comment_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
