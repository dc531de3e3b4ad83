"""Root fixtures: the tiny tokenizer every gateway test uses, and the shared
real-vLLM cluster (`testing.vllm_cluster`, started once per session)."""

from __future__ import annotations

import pathlib

import pytest

from gateway.serving.tokenize import PromptTokenizer
from testing.tiny_tokenizer import write_tiny_tokenizer

pytest_plugins = ["testing.vllm_cluster", "testing.netns_testbed"]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: pathlib.Path) -> PromptTokenizer:
    return PromptTokenizer.from_dir(str(tokenizer_dir))


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `testbed` run first. They read through NIXL in this process from
    inside the testbed's network namespaces; UCX, once another test has set it up in
    this process, fails there ("no route" to the namespace's own address: failed to
    create ep), so they must be the first to set it up."""
    items.sort(key=lambda item: item.get_closest_marker("testbed") is None)
