"""Ahead-of-time compilation of every bucket graph, with a persistent, shared artifact cache.

``driver`` compiles an LLM's bucket graphs; ``diffusion`` compiles a diffusion pipeline's component
graphs (text encoder, DiT experts, VAE) through the same driver and cache.
"""

from .cache import ArtifactCache, CorruptArtifactWarning
from .driver import (
    CompileError,
    CompileTarget,
    GraphResult,
    compile_all,
    compile_graph,
    graph_key,
    graph_keys,
)
from .load import load_compiled_graphs, runner_graphs

__all__ = [
    "ArtifactCache",
    "CompileError",
    "CompileTarget",
    "CorruptArtifactWarning",
    "GraphResult",
    "compile_all",
    "compile_graph",
    "graph_key",
    "graph_keys",
    "load_compiled_graphs",
    "runner_graphs",
]
