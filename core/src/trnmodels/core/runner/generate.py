"""Text in, text out: tokenize, run the runner on every TP rank, detokenize.

Compiled graphs are used when the cache holds them for this exact configuration (``eager=False``);
any graph not in the cache runs eagerly, so a partial compile still works.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..hf_config import read_config_dict
from ..parallel.launch import run_on_ranks
from ..parallel.state import ParallelLayout, get_parallel_layout
from .config import RunnerConfig, SamplingParams
from .engine import Generation, Runner, check_prompt

DEFAULT_MAX_MODEL_LEN = 512


def runner_config_for(
    checkpoint_dir: str | Path,
    *,
    max_num_seqs: int = 8,
    max_model_len: int | None = None,
    block_size: int = 32,
    num_batched_tokens_buckets: tuple[int, ...] | None = None,
    num_seqs_buckets: tuple[int, ...] | None = None,
    context_len_buckets: tuple[int, ...] | None = None,
) -> RunnerConfig:
    """The runner config a command uses: ``max_model_len`` defaults to the model's context, capped;
    bucket lists default to powers of two (see ``RunnerConfig``)."""
    raw = read_config_dict(checkpoint_dir)
    context = raw.get("max_position_embeddings") or raw.get("text_config", {}).get("max_position_embeddings")
    if max_model_len is None:
        max_model_len = min(context or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)
    elif context and max_model_len > context:
        raise ConfigError(
            f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={context}"
        )
    return RunnerConfig(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        block_size=block_size,
        num_batched_tokens_buckets=num_batched_tokens_buckets,
        num_seqs_buckets=num_seqs_buckets,
        context_len_buckets=context_len_buckets,
    )


@dataclass(frozen=True)
class GenerateJob:
    checkpoint_dir: str
    prompts: tuple[tuple[int, ...], ...]
    params: SamplingParams
    runner: RunnerConfig
    dtype: str = "float32"
    cache_dir: str | None = None
    eager: bool = False


def _eos_token_ids(checkpoint_dir: str) -> list[int]:
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(checkpoint_dir).eos_token_id
    except OSError:  # no generation_config.json: the model config's, as transformers derives it
        raw = read_config_dict(checkpoint_dir)
        eos = raw.get("eos_token_id")
        if eos is None:  # a multimodal config (Gemma 4) states it in its text config only
            eos = (raw.get("text_config") or {}).get("eos_token_id")
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _generate_on_rank(rank: int, world_size: int, job: GenerateJob) -> dict[str, Any]:
    from ..causal_lm import build_model
    from ..compile import CompileTarget, runner_graphs

    layout = get_parallel_layout()
    target = CompileTarget(job.checkpoint_dir, job.runner, tp=layout.tp, dtype=job.dtype, ep=layout.ep)
    model = build_model(job.checkpoint_dir, target.neuron_config(), progress=rank == 0)
    graphs = runner_graphs(target, model, job.cache_dir, eager=job.eager)
    runner = Runner(
        model, job.runner, rank=rank, eos_token_id=_eos_token_ids(job.checkpoint_dir), graphs=graphs
    )
    results = runner.generate([list(p) for p in job.prompts], job.params)
    return {"results": results, "compiled_graphs": len(graphs), "steps": [s.name for s in runner.steps]}


def generate_token_ids(job: GenerateJob, tp: int = 1, ep: int = 1) -> dict[str, Any]:
    """``{"results": [Generation], "compiled_graphs": n, "steps": [...]}`` from rank 0 of ``tp * ep``.

    The config is validated against the mesh first, so a TP/EP degree the model refuses fails before any
    rank starts. Non-finite logits at any step raise ``NonFiniteLogitsError`` (see ``Runner``)."""
    from ..causal_lm import check_model_config
    from ..compile import CompileTarget

    target = CompileTarget(job.checkpoint_dir, job.runner, tp=tp, dtype=job.dtype, ep=ep)
    hf_config = check_model_config(job.checkpoint_dir, target.neuron_config())
    for i, prompt in enumerate(job.prompts):
        check_prompt(i, prompt, job.runner.max_model_len, hf_config.get_text_config().vocab_size)
    return run_on_ranks(_generate_on_rank, ParallelLayout(tp=tp, ep=ep), job)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_tokenizer(checkpoint_dir: str | Path) -> Any:
    """The checkpoint's own tokenizer; none, or one transformers cannot read, is a ``ConfigError``."""
    from transformers import AutoTokenizer

    if not any((Path(checkpoint_dir) / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"{checkpoint_dir}: no usable tokenizer for text prompts: none of {', '.join(TOKENIZER_FILES)}"
        )
    try:
        return AutoTokenizer.from_pretrained(str(checkpoint_dir), local_files_only=True)
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split())  # transformers' messages run over several lines
        raise ConfigError(f"{checkpoint_dir}: no usable tokenizer for text prompts: {reason}") from None


def generate_texts(
    checkpoint_dir: str | Path,
    prompts: Sequence[str],
    params: SamplingParams,
    *,
    runner: RunnerConfig | None = None,
    tp: int = 1,
    ep: int = 1,
    dtype: str = "float32",
    cache_dir: str | None = None,
    eager: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``([{"prompt", "token_ids", "text", "finish_reason"}], stats)`` for each prompt, in order."""
    tokenizer = load_tokenizer(checkpoint_dir)
    encoded = tuple(tuple(tokenizer(p)["input_ids"]) for p in prompts)
    job = GenerateJob(
        str(checkpoint_dir),
        encoded,
        params,
        runner or runner_config_for(checkpoint_dir),
        dtype,
        cache_dir,
        eager,
    )
    out = generate_token_ids(job, tp, ep)
    results: list[Generation] = out["results"]
    outputs = [
        {
            "prompt": prompt,
            "token_ids": r.token_ids,
            "text": tokenizer.decode(r.token_ids, skip_special_tokens=True),
            "finish_reason": r.finish_reason,
        }
        for prompt, r in zip(prompts, results, strict=True)
    ]
    return outputs, {"compiled_graphs": out["compiled_graphs"], "steps": len(out["steps"])}
