"""Step 5 of onboarding, on paper: which meshes of an instance a model fits (``trnmodels plan``).

``plan(source, instance)`` takes a checkpoint folder, a ``config.json`` path or a bundled published config's
name (as ``trnmodels diff`` does) and lists every TP x EP x DP mesh of the instance's logical NeuronCores the
serving plugin accepts, each with its memory per core against the core's HBM, and the decode step's
bandwidth bound. The result is one JSON-able dict.

The bytes are the plugin's own, not a formula beside it: for each (TP, EP) the plugin's model is built on the
``meta`` device (no memory) at rank 0's coordinate of the mesh, and its parameters and buffers are summed;
the KV cache is its ``get_kv_spec().bytes_per_block()`` times the blocks the runner allocates. Every rank of
a mesh holds the same shapes (vocab and expert splits are even by construction), so rank 0 stands for all.
``measure_rank`` builds the real model on a live rank and counts what it allocates, which is what the tests
check the plan against.

Per core:

- ``weights``: parameters and buffers of one rank's model, in ``dtype`` (gpt-oss's MXFP4 experts are
  dequantized at load, so they occupy ``dtype`` too);
- ``kv_cache``: ``max_num_seqs * ceil(max_model_len / block_size) + 1`` blocks (the runner's count: every
  sequence at full length, plus the null block) of the model's ``bytes_per_block``; sliding-window layers
  get as many blocks as the others, as ``allocate_kv_cache`` gives them;
- ``working``: an estimate, not a measurement (the compiler's scratch is not known before compiling): the
  activations of one prefill of ``max_model_len`` tokens (the largest token bucket: a whole prompt prefills
  in one step), ``tokens * (2 * hidden + widest) * itemsize`` where ``widest`` is the widest per-token
  output of any projection on the rank (for MoE, every local expert's ``gate_up`` output: each rank runs all
  of its experts on every token), plus the gathered float32 logits of ``max_num_seqs`` rows. It leaves out
  the attention score tiles and the Neuron runtime's own reservation, so "fits" is necessary, not
  sufficient;
- ``decode_weight_bytes``: the weights one decode step reads: all of them except the embedding tables a
  step only gathers rows from (a table tied to the LM head is read whole by the head, so it counts). An MoE
  rank reads all its local experts, as it runs them all. Divided by the core's share of HBM bandwidth this
  is the step's lower bound in time.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..hf_config import CONFIG_NAME
from .diff import ConfigSource, _quiet, load_source, refusal_reason
from .instances import Instance, get_instance

DEFAULT_MAX_NUM_SEQS = 8
MAX_MODEL_LEN_CAP = 8192  # the default max_model_len is the config's max_position_embeddings, capped here
BLOCK_SIZE = 32  # NeuronConfig's default tokens per KV block
LOGITS_ITEMSIZE = 4  # compute_logits returns float32


@dataclass(frozen=True)
class RankBytes:
    """What one rank of a (TP, EP) mesh holds, from the plugin's model built on the meta device."""

    weight_bytes: int
    gathered_embedding_bytes: int  # embedding tables a decode step only gathers rows from
    kv_bytes_per_block: int
    hidden_size: int
    widest_per_token: int  # elements: the widest projection output per token on this rank
    padded_vocab: int
    has_experts: bool

    @property
    def decode_weight_bytes(self) -> int:
        return self.weight_bytes - self.gathered_embedding_bytes


# ------------------------------------------------------------------------------------------- the model


def kv_blocks(max_model_len: int, max_num_seqs: int, block_size: int = BLOCK_SIZE) -> int:
    """The blocks the runner allocates (``RunnerConfig.num_blocks``): every sequence at full length, plus
    the null block."""
    from ..runner.config import RunnerConfig

    return RunnerConfig(
        max_num_seqs=max_num_seqs, max_model_len=max_model_len, block_size=block_size
    ).num_blocks


def _tensor_bytes(t: Any) -> int:
    return t.numel() * t.element_size()


def rank_bytes(model: Any) -> RankBytes:
    """The bytes of a built model (on any device, meta included): parameters and buffers once each (a
    tied head shares the embedding's table), and its KV spec."""
    from ..diffusion.memory import module_bytes
    from ..modules.moe import MoEExperts
    from ..parallel.layers import ParallelLMHead, VocabParallelEmbedding

    weight_bytes = module_bytes(model)
    heads = {id(m.weight) for m in model.modules() if isinstance(m, ParallelLMHead)}
    gathered = sum(
        _tensor_bytes(m.weight)
        for m in model.modules()
        if isinstance(m, VocabParallelEmbedding) and id(m.weight) not in heads
    )
    widest, has_experts, padded_vocab = 0, False, 0
    for m in model.modules():
        if isinstance(m, MoEExperts):
            has_experts = True
            widest = max(widest, m.gate_up.shape[0] * m.gate_up.shape[2])
        elif isinstance(m, ParallelLMHead):
            padded_vocab = m.rows_per_rank * m.tp.world_size
        elif isinstance(m, VocabParallelEmbedding):
            continue
        else:
            weight = m._parameters.get("weight")
            if weight is not None and weight.dim() == 2:
                widest = max(widest, weight.shape[0])
    return RankBytes(
        weight_bytes=weight_bytes,
        gathered_embedding_bytes=gathered,
        kv_bytes_per_block=model.get_kv_spec().bytes_per_block(),
        hidden_size=model.config.hidden_size,
        widest_per_token=widest,
        padded_vocab=padded_vocab,
        has_experts=has_experts,
    )


def build_on_meta(plugin: Any, hf_config: Any, neuron_config: Any) -> Any:
    """Rank 0's model of the plugin at ``neuron_config``'s TP x EP, on the meta device. Raises the plugin's
    own error when it refuses the mesh."""
    import torch

    from ..parallel.state import ParallelLayout, rank0_layout

    layout = ParallelLayout(tp=neuron_config.tp_degree, ep=neuron_config.ep_degree)
    with rank0_layout(layout), torch.device("meta"), _quiet():
        return plugin.load_factory()(hf_config, neuron_config)


def measure_rank(
    rank: int, world_size: int, config_dirs: list[str], dtype: str, num_blocks: int
) -> dict[str, list[dict[str, int]]]:
    """On a live rank (``parallel.launch.run_on_ranks``; the parallel state is set): for each checkpoint
    folder, build the plugin's real model on CPU and count the bytes it allocates, by distinct storage, and
    the bytes of a KV cache of ``num_blocks`` blocks allocated from its spec. Returns, per folder, every
    rank's counts in rank order (one launch measures several models: starting ranks is the slow part)."""
    import torch.distributed as dist

    from ..causal_lm import resolve_checkpoint
    from ..kv_cache import allocate_kv_cache
    from ..parallel.state import get_parallel_layout
    from ..runtime_config import NeuronConfig

    layout = get_parallel_layout()
    out: dict[str, list[dict[str, int]]] = {}
    for config_dir in config_dirs:
        plugin, hf_config = resolve_checkpoint(config_dir)
        neuron_config = NeuronConfig(tp_degree=layout.tp, ep_degree=layout.ep, dtype=dtype)
        with _quiet():
            model = plugin.load_factory()(hf_config, neuron_config)
        storages: dict[int, int] = {}
        for t in [*model.parameters(), *model.buffers()]:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        caches = allocate_kv_cache(model.get_kv_spec(), num_blocks)
        kv = sum(t.untyped_storage().nbytes() for pair in caches.values() for t in pair)
        mine = {"rank": rank, "weight_bytes": sum(storages.values()), "kv_cache_bytes": kv}
        everyone: list[Any] = [mine]
        if world_size > 1:
            everyone = [None] * world_size
            dist.all_gather_object(everyone, mine)
        out[config_dir] = everyone
    return out


# ------------------------------------------------------------------------------------------- the source


def _check_llm_config(source: ConfigSource) -> None:
    config = source.config
    if "_diffusers_version" in config or "_class_name" in config:
        raise ConfigError(
            f"{source.describe()} is one component of a diffusers pipeline: plan the pipeline's folder "
            "(the one holding model_index.json)"
        )
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
        raise ConfigError(f"{source.describe()}: missing 'architectures' (a list naming the model class)")


def _hf_config(source: ConfigSource, plugin: Any) -> Any:
    """transformers' config, read as ``causal_lm.resolve_checkpoint`` reads a checkpoint's."""
    from ..hf_config import load_hf_config

    missing = [f for f in plugin.required_config_fields if f not in source.config]
    if missing:
        raise ConfigError(f"{source.describe()}: missing required field(s): {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as folder, _quiet():
        (Path(folder) / CONFIG_NAME).write_text(json.dumps(source.config))
        try:
            return load_hf_config(folder)
        except ConfigError as e:
            raise ConfigError(f"{source.describe()}: {str(e).split(': ', 1)[-1]}") from None


def _max_position_embeddings(hf_config: Any) -> int | None:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    value = getattr(text, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ------------------------------------------------------------------------------------------------ plan


def mesh_entry(
    rb: RankBytes,
    instance: Instance,
    *,
    tp: int,
    ep: int,
    itemsize: int,
    max_model_len: int,
    max_num_seqs: int,
    num_blocks: int,
) -> dict[str, Any]:
    """One mesh's row: memory per core against the core's HBM, and the decode bound."""
    kv = rb.kv_bytes_per_block * num_blocks
    activations = max_model_len * (2 * rb.hidden_size + rb.widest_per_token) * itemsize
    logits = max_num_seqs * rb.padded_vocab * LOGITS_ITEMSIZE
    working = activations + logits
    total = rb.weight_bytes + kv + working
    hbm = instance.hbm_bytes_per_core
    return {
        "tp": tp,
        "ep": ep,
        "dp": instance.cores // (tp * ep),
        "cores_per_replica": tp * ep,
        "weight_bytes_per_core": rb.weight_bytes,
        "kv_bytes_per_block": rb.kv_bytes_per_block,
        "kv_cache_bytes_per_core": kv,
        "working_bytes_per_core": working,
        "total_bytes_per_core": total,
        "hbm_bytes_per_core": hbm,
        "fits": total <= hbm,
        "headroom_bytes": hbm - total,
        "decode_weight_bytes_per_core": rb.decode_weight_bytes,
        "decode_ms_bound": 1000.0 * rb.decode_weight_bytes / instance.hbm_bandwidth_per_core,
    }


def plan(
    source: str,
    instance: str,
    *,
    max_model_len: int | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """Every mesh of ``instance`` the plugin serving ``source`` accepts, with its memory per core (see the
    module docstring). ``max_model_len`` defaults to the config's ``max_position_embeddings``, capped at
    ``MAX_MODEL_LEN_CAP``."""
    from ..plugins import plugin_for_architecture
    from ..runtime_config import NeuronConfig, parse_dtype

    inst = get_instance(instance)
    for name, value in (("max_num_seqs", max_num_seqs), ("max_model_len", max_model_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"--{name.replace('_', '-')}: expected a positive integer, got {value!r}")
    torch_dtype = parse_dtype(dtype)
    src = load_source(source)
    _check_llm_config(src)
    architecture = src.config["architectures"][0]
    plugin = plugin_for_architecture(architecture)
    plugin.check_model_type(architecture, src.config.get("model_type"), where=f"{src.describe()}: ")
    hf_config = _hf_config(src, plugin)
    longest = _max_position_embeddings(hf_config)
    if max_model_len is None:
        max_model_len = min(longest or MAX_MODEL_LEN_CAP, MAX_MODEL_LEN_CAP)
    elif longest is not None and max_model_len > longest:
        raise ConfigError(
            f"--max-model-len {max_model_len} exceeds the model's max_position_embeddings {longest}"
        )
    num_blocks = kv_blocks(max_model_len, max_num_seqs)

    def neuron_config(tp: int, ep: int) -> NeuronConfig:
        return NeuronConfig(
            tp_degree=tp, ep_degree=ep, dtype=torch_dtype, block_size=BLOCK_SIZE, max_model_len=max_model_len
        )

    try:
        has_experts = rank_bytes(build_on_meta(plugin, hf_config, neuron_config(1, 1))).has_experts
    except Exception as e:  # a plugin may raise anything on a config it was not written for
        raise ConfigError(f"{src.describe()}: plugin {plugin.name} refuses it: {refusal_reason(e)}") from None
    meshes, refused = [], []
    for tp in _divisors(inst.cores):
        for ep in _divisors(inst.cores // tp) if has_experts else [1]:
            try:
                model = build_on_meta(plugin, hf_config, neuron_config(tp, ep))
            except Exception as e:
                refused.append({"tp": tp, "ep": ep, "reason": refusal_reason(e)})
                continue
            meshes.append(
                mesh_entry(
                    rank_bytes(model),
                    inst,
                    tp=tp,
                    ep=ep,
                    itemsize=torch_dtype.itemsize,
                    max_model_len=max_model_len,
                    max_num_seqs=max_num_seqs,
                    num_blocks=num_blocks,
                )
            )
    return {
        "kind": "llm",
        "source": src.describe(),
        "architecture": architecture,
        "plugin": plugin.name,
        "instance": inst.describe(),
        "settings": {
            "dtype": dtype,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "block_size": BLOCK_SIZE,
            "kv_blocks": num_blocks,
        },
        "meshes": meshes,
        "refused": refused,
    }
