"""Fixtures for the gateway's unit tests: a tiny tokenizer and in-process fake workers."""

from __future__ import annotations

import pathlib

import pytest

from testing.tiny_tokenizer import write_tiny_tokenizer
from gateway.serving.tokenize import PromptTokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: pathlib.Path) -> PromptTokenizer:
    return PromptTokenizer.from_dir(str(tokenizer_dir))
