"""Shared set-up of the package's tests.

tiktoken, the reference the counts are checked against, downloads its encodings on first
use; this machine has no internet beyond the package registries. The same files ship in the
`tiktoken-rs` crate (a dev-dependency of the workspace, so in Cargo's registry after any
build), byte for byte: tiktoken checks their SHA-256 against the ones it expects. They are
put where tiktoken looks before it would download.
"""

import hashlib
import json
import os
import pathlib
import shutil
import socket
import subprocess
import time

import pytest

WORKSPACE = pathlib.Path(__file__).resolve().parents[3]
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"


def _tiktoken_assets() -> pathlib.Path:
    # The version the workspace locks, found where Cargo unpacks registry crates (any
    # build of the workspace's tests put it there). Not `cargo metadata`: offline, it needs
    # every locked package, even those of other platforms, which a build never fetches.
    lock = (WORKSPACE / "Cargo.lock").read_text()
    version = None
    for block in lock.split("[[package]]"):
        if 'name = "tiktoken-rs"' in block:
            version = block.split('version = "', 1)[1].split('"', 1)[0]
    if version is None:
        raise RuntimeError("tiktoken-rs is not in the workspace's Cargo.lock")
    cargo_home = pathlib.Path(os.environ.get("CARGO_HOME", pathlib.Path.home() / ".cargo"))
    for source in sorted((cargo_home / "registry" / "src").glob("*")):
        assets = source / f"tiktoken-rs-{version}" / "assets"
        if assets.is_dir():
            return assets
    raise RuntimeError(
        f"tiktoken-rs {version} is not unpacked under {cargo_home}/registry/src: "
        "build the workspace's tests first (cargo test --workspace --no-run)"
    )


def _seed_tiktoken_cache() -> None:
    cache = WORKSPACE / "target" / "tiktoken-cache"
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    assets = None
    for name in ("cl100k_base", "o200k_base"):
        key = hashlib.sha1(TIKTOKEN_URL.format(name).encode()).hexdigest()
        if (cache / key).exists():
            continue
        assets = assets or _tiktoken_assets()
        shutil.copyfile(assets / f"{name}.tiktoken", cache / key)


_seed_tiktoken_cache()


@pytest.fixture(scope="session")
def workspace() -> pathlib.Path:
    """The repository's root."""
    return WORKSPACE


@pytest.fixture(scope="session")
def binaries() -> pathlib.Path:
    """The folder of the workspace's binaries (`contexture`, `contexture-fake-upstream`),
    built from this checkout."""
    subprocess.run(
        [
            "cargo",
            "build",
            "--quiet",
            "-p",
            "contexture-cli",
            "-p",
            "contexture-fake-upstream",
        ],
        cwd=WORKSPACE,
        check=True,
    )
    return WORKSPACE / "target" / "debug"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within 30 s")


class FakeUpstream:
    """The workspace's fake OpenAI-compatible provider in a process of its own, answering
    from a script and recording what it was sent."""

    def __init__(self, binaries: pathlib.Path, folder: pathlib.Path, script: list):
        self.port = free_port()
        self.record = folder / f"upstream-{self.port}.jsonl"
        script_file = folder / f"script-{self.port}.json"
        script_file.write_text(json.dumps(script))
        self.process = subprocess.Popen(
            [
                str(binaries / "contexture-fake-upstream"),
                f"127.0.0.1:{self.port}",
                "--script",
                str(script_file),
                "--record",
                str(self.record),
            ],
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.process, "the fake upstream")
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def requests(self) -> list:
        """Every call's request body, in order."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def fake_upstream(binaries, tmp_path):
    """Starts fake upstreams: `fake_upstream(script)`; each is stopped after the test."""
    started = []

    def start(script):
        upstream = FakeUpstream(binaries, tmp_path, script)
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        upstream.stop()


@pytest.fixture(scope="session")
def server(binaries, tmp_path_factory):
    """A real `contexture serve` on SQLite with two tenants' keys (`acme`, `globex`), its
    upstream the fake provider; `{"url", "keys"}`."""
    folder = tmp_path_factory.mktemp("serve")
    db = f"sqlite:{folder / 'serve.db'}"
    keys = {}
    for tenant in ("acme", "globex"):
        printed = subprocess.run(
            [str(binaries / "contexture"), "keys", "create", "--tenant", tenant, "--db", db],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        keys[tenant] = printed.split()[0]
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [str(binaries / "contexture-fake-upstream"), f"127.0.0.1:{upstream_port}"],
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(upstream_port, upstream, "the fake upstream")
    port = free_port()
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "CONTEXTURE_"))
    }
    environment.update(
        CONTEXTURE_UPSTREAM_URL=f"http://127.0.0.1:{upstream_port}/v1",
        CONTEXTURE_UPSTREAM_KEY="upstream-key",
    )
    process = subprocess.Popen(
        [str(binaries / "contexture"), "serve", "--db", db, "--bind", f"127.0.0.1:{port}"],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process, "contexture serve")
        yield {"url": f"http://127.0.0.1:{port}", "keys": keys}
    finally:
        process.terminate()
        process.wait(timeout=30)
        upstream.kill()
        upstream.wait()
