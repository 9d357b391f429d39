"""A local, offline Hub for tests: `olah` on 127.0.0.1 serving git work trees as model repos.

Repos live under `<root>/mirrors/models/<org>/<name>/` as plain git work trees (no LFS); a new
commit there is served at once. olah proxies a few calls upstream even when offline, so the
upstream is a closed local port. See shared/HUB-TESTING.md.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CONFIG = """\
[basic]
host = "127.0.0.1"
port = {port}
repos-path = "{root}/repos"
mirror-scheme = "http"
mirror-netloc = "127.0.0.1:{port}"
mirror-lfs-netloc = "127.0.0.1:{port}"
hf-scheme = "http"
hf-netloc = "127.0.0.1:{closed}"
hf-lfs-netloc = "127.0.0.1:{closed}"
mirrors-path = ["{root}/mirrors"]

[accessibility]
offline = true
"""
GIT_ENV = {"GIT_AUTHOR_NAME": "zoo tests", "GIT_AUTHOR_EMAIL": "tests@zoo.invalid",
           "GIT_COMMITTER_NAME": "zoo tests", "GIT_COMMITTER_EMAIL": "tests@zoo.invalid"}


def olah_executable() -> str | None:
    """`olah-cli` beside this interpreter (the project venv) or on PATH."""
    beside = Path(sys.executable).parent / "olah-cli"
    return str(beside) if beside.is_file() else shutil.which("olah-cli")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args], cwd=repo,
                            env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=30)
    if result.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {result.stderr}")
    return result.stdout.strip()


class OlahServer:
    """Start olah on a free port; `commit_folder` publishes a model folder as a new commit.

    Use as a context manager; waits for readiness at most `start_timeout` seconds and stops the
    server (by its PID) on exit.
    """

    def __init__(self, root: Path, start_timeout: float = 30.0):
        self.root, self.start_timeout = Path(root), start_timeout
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process = None

    def repo_dir(self, repo_id: str) -> Path:
        return self.root / "mirrors" / "models" / repo_id

    def commit_folder(self, repo_id: str, folder: Path, message: str, tag: str | None = None) -> str:
        """Replace the repo's files by `folder`'s, commit (and tag); returns the commit sha."""
        repo = self.repo_dir(repo_id)
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True)
            git(repo, "init", "-q", "-b", "main")
        for old in repo.iterdir():
            if old.name != ".git":
                old.unlink()
        for file in Path(folder).iterdir():
            if file.is_file() and not file.name.startswith("."):
                shutil.copy2(file, repo / file.name)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message)
        if tag:
            git(repo, "tag", tag)
        return git(repo, "rev-parse", "HEAD")

    def __enter__(self) -> "OlahServer":
        for sub in ("repos", "mirrors", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        config = self.root / "olah.toml"
        config.write_text(CONFIG.format(port=self.port, root=self.root, closed=free_port()))
        log = open(self.root / "server.log", "wb")
        self.process = subprocess.Popen(
            [olah_executable(), "-c", str(config), "--host", "127.0.0.1", "--port", str(self.port),
             "--log-path", str(self.root / "logs")], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.endpoint}/api/models/none/none/refs", timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # answering (404 for a missing repo): ready
            except OSError:
                time.sleep(0.2)
        self.__exit__(None, None, None)
        log = (self.root / "server.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"olah did not start on {self.endpoint} within {self.start_timeout} s:\n{log}")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None
