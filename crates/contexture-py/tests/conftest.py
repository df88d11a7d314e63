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
import subprocess

import pytest

WORKSPACE = pathlib.Path(__file__).resolve().parents[3]
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"


def _tiktoken_assets() -> pathlib.Path:
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--offline"],
            cwd=WORKSPACE,
            check=True,
            capture_output=True,
        ).stdout
    )
    for package in metadata["packages"]:
        if package["name"] == "tiktoken-rs":
            return pathlib.Path(package["manifest_path"]).parent / "assets"
    raise RuntimeError("tiktoken-rs is not among the workspace's packages")


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
