"""The conformance suite every LLM plugin runs against its transformers twin.

A plugin's tests subclass ``CausalLMConformance`` and set ``spec``; pytest then collects, for that
plugin: registration, entry points and ``trnmodels info``; decoder-layer parity; teacher-forced logits
through prefill and paged decode past any sliding window at every mesh (TP=1, TP=2, and EP=2 and
TP=2 x EP=2 for the mixture-of-experts configs); greedy parity with HF ``generate`` on a ragged batch;
the public ``logits`` and ``generate`` commands on several ranks; compiled graphs equal to eager, and one
compiled artifact per graph serving every rank; the mesh errors raised before any rank starts. What
stays in the plugin's own tests is what only it has.

Checkpoints start from the plugin's bundled ``tiny/config.json`` (the same file the demo, the compile
session and the vLLM harness read) with the spec's overrides merged in, plus random configs drawn from
the spec. The draw's seed is printed in the test report header and in every failure message;
``TRNMODELS_TEST_SEED`` replays it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from safetensors.torch import load_file
from transformers import PretrainedConfig, PreTrainedModel

from ..accuracy import compare_teacher_forced_logits, greedy_teacher_sequence, hf_logits
from ..accuracy.bisect import capture, decoder_layers
from ..causal_lm import build_model, check_model_config
from ..errors import ConfigError, ShardingError
from ..plugins import ModelPlugin, discover_plugins, plugin_for_architecture
from ..runner.config import RunnerConfig, SamplingParams
from ..runner.engine import Runner
from ..runner.generate import GenerateJob, generate_token_ids
from ..runner.score import ScoreJob, score_many, teacher_forced_logits
from ..runtime_config import NeuronConfig
from .checkpoints import save_checkpoint, save_random_checkpoint
from .cli import run_cli

SEED = int(os.environ.get("TRNMODELS_TEST_SEED", random.randrange(1 << 30)))

# FP32 on both sides: what remains is summation order, ~1e-6 relative per op, well under this.
FP32_ATOL = 1e-4

# Two token buckets and two context buckets exercise padding; 5 prompts on 4 slots make the fifth wait,
# so prefill and decode steps interleave.
RUNNER = RunnerConfig(
    max_num_seqs=4,
    max_model_len=64,
    block_size=8,
    num_batched_tokens_buckets=(32, 64),
    num_seqs_buckets=(2, 4),
    context_len_buckets=(32, 64),
)
PROMPT_LENGTHS = (5, 17, 1, 9, 30)
NEW_TOKENS = 12
# The BF16 three-way judges error distributions, which a few positions cannot show; and a tiny random
# model's greedy continuation repeats one or two tokens (a few distinct states, however many positions), so
# the random case sequence is the prompt (prefilled up to the case's split, then decoded) and greedy
# continuation only tops it up to this many positions.
VALIDATE_POSITIONS = 50
VALIDATE_MIN_NEW_TOKENS = 4


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied; nested dicts (a ``text_config``) merge key by key."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping) and not key.startswith("rope"):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def float_fields(config: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The key path of every float in a config dict, nested dicts included."""
    for key, value in config.items():
        if isinstance(value, float):
            yield (*prefix, key)
        elif isinstance(value, Mapping):
            yield from float_fields(value, (*prefix, key))


def with_value(config: Mapping[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``config`` with the field at ``path`` set to ``value``."""
    head, *rest = path
    return {**config, head: with_value(config[head], tuple(rest), value) if rest else value}


def canonical(distribution: str) -> str:
    """A distribution name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def perturb_norms(model: torch.nn.Module) -> None:
    """Random init leaves norm scales at 1 (or 0); perturb them so a norm mapped to the wrong key shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))


@dataclass(frozen=True)
class ConformanceSpec:
    """What a plugin tells the suite: its entry-point name, its transformers twin, and its configs.

    ``configs`` maps a case name to overrides of the bundled tiny config (the variants the plugin must
    serve); ``random_config`` draws one more the tests were not written for. ``moe`` says every config
    has experts; ``moe_configs`` names the ones that do when the model is dense by default: the
    expert-parallel meshes run on those. ``hf_attributes`` are set on the HF config after construction
    (the eager attention path is the readable reference); ``perturb`` moves the weights random init
    leaves at a constant (norm scales), so a wrong key mapping shows.
    """

    plugin: str
    hf_class: type[PreTrainedModel]
    configs: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: {"tiny": {}})
    random_config: Callable[[random.Random], dict[str, Any]] | None = None
    num_random_configs: int = 1
    moe: bool = False
    moe_configs: tuple[str, ...] = ()
    hf_attributes: Mapping[str, str] = field(default_factory=lambda: {"_attn_implementation": "eager"})
    perturb: Callable[[torch.nn.Module], None] = perturb_norms

    @cached_property
    def model_plugin(self) -> ModelPlugin:
        return discover_plugins()[self.plugin]

    @property
    def architecture(self) -> str:
        return self.model_plugin.architectures[0]

    @property
    def has_experts(self) -> bool:
        return self.moe or bool(self.moe_configs)

    @property
    def meshes(self) -> tuple[tuple[int, int], ...]:
        """(tp, ep) pairs teacher-forced logits run on: EP=2 alone and inside TP=2 for expert models."""
        return ((1, 1), (2, 1), (1, 2), (2, 2)) if self.has_experts else ((1, 1), (2, 1))

    @property
    def multi_rank_mesh(self) -> tuple[int, int]:
        """The two-rank mesh the public commands and the shared compiled graphs are checked on."""
        return (1, 2) if self.moe else (2, 1)

    def serves_mesh(self, case_name: str, ep: int) -> bool:
        """Whether the case runs at this EP degree (a dense config refuses expert parallelism)."""
        return ep == 1 or self.moe or case_name in self.moe_configs

    def tiny_config(self) -> dict[str, Any]:
        path = self.model_plugin.bundled_config_dir("tiny") / "config.json"
        return json.loads(path.read_text())

    def hf_config(self, **overrides: Any) -> PretrainedConfig:
        config = self.hf_class.config_class(**merge(self.tiny_config(), overrides))
        self.set_hf_attributes(config)
        return config

    def set_hf_attributes(self, config: PretrainedConfig) -> None:
        """Set ``hf_attributes`` on the config and on its text config (a multimodal model reads those)."""
        for sub in {id(config): config, id(text := config.get_text_config()): text}.values():
            for name, value in self.hf_attributes.items():
                setattr(sub, name, value)

    def build_hf(self, seed: int = 0, **overrides: Any) -> PreTrainedModel:
        torch.manual_seed(seed)
        model = self.hf_class(self.hf_config(**overrides)).eval()
        self.perturb(model)
        return model

    def from_pretrained(self, checkpoint: str | Path) -> PreTrainedModel:
        """The HF twin loaded from a saved checkpoint, FP32, with ``hf_attributes`` set."""
        model = self.hf_class.from_pretrained(checkpoint, dtype=torch.float32).eval()
        self.set_hf_attributes(model.config)
        return model

    def checkpoint_factory(
        self, root: Path, build: Callable[..., PreTrainedModel] | None = None
    ) -> Callable[..., tuple[Path, PreTrainedModel]]:
        """``make(seed=0, max_shard_size=None, **overrides) -> (checkpoint dir, HF model)``: a fresh
        folder under ``root`` per call (a plugin's ``make_checkpoint`` fixture). ``build(seed,
        **overrides)`` makes the model (default ``build_hf``)."""
        counter = itertools.count()
        build = build or self.build_hf

        def make(seed: int = 0, max_shard_size: str | int | None = None, **overrides: Any):
            model = build(seed, **overrides)
            out = save_checkpoint(model, root / f"ckpt{next(counter)}", max_shard_size=max_shard_size)
            return out, model

        return make

    def cases(self, rng: random.Random) -> dict[str, dict[str, Any]]:
        cases = {name: dict(overrides) for name, overrides in self.configs.items()}
        if self.random_config is not None:
            for i in range(self.num_random_configs):
                cases[f"random{i}"] = self.random_config(rng)
        return cases


@dataclass
class Case:
    name: str
    overrides: dict[str, Any]
    checkpoint: Path
    hf: PreTrainedModel
    token_ids: list[int]
    prefill_len: int
    hf_logits: torch.Tensor

    def describe(self, **mesh: int) -> str:
        where = " ".join(f"{k}={v}" for k, v in mesh.items())
        return f"{self.name} {where} prefill={self.prefill_len} seed={SEED} overrides={self.overrides}"


def layer_outputs(model: torch.nn.Module, num_layers: int, run: Callable[[], Any]) -> list[torch.Tensor]:
    """Each decoder layer's output hidden states ``[T, hidden]`` while ``run()`` runs the model once."""
    captured = capture(decoder_layers(model, num_layers), (), run)
    return [captured.outputs[(i, "")][0] for i in range(num_layers)]


def mesh_param(tp: int, ep: int):
    """A (tp, ep) parameter; anything past one rank starts processes and is marked slow."""
    marks = [pytest.mark.slow] if tp * ep > 1 else []
    return pytest.param(tp, ep, id=f"tp{tp}" if ep == 1 else f"tp{tp}ep{ep}", marks=marks)


def at_most_two_ranks(test: Callable[..., None]) -> Callable[..., None]:
    """Run a (tp, ep) test on the meshes of one and two ranks only (the four-rank mesh checks logits)."""
    test.max_ranks = 2  # type: ignore[attr-defined]
    return test


# Small enough to compile in seconds: prompts of up to 7 tokens plus 9 new ones fit 32 positions.
COMPILE_RUNNER = RunnerConfig(
    max_num_seqs=2, max_model_len=32, block_size=8, num_batched_tokens_buckets=(32,), num_seqs_buckets=(2,),
    context_len_buckets=(32,),
)  # fmt: skip
COMPILE_PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
CLI_PROMPTS = ["Hello, my name is", "The quick brown fox jumps over the lazy dog."]


class CausalLMConformance:
    """Subclass as ``TestConformance`` in a plugin's tests and set ``spec``."""

    spec: ClassVar[ConformanceSpec]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        # Every test taking (tp, ep) runs on each of the plugin's meshes (up to its rank limit).
        if {"tp", "ep"} <= set(metafunc.fixturenames):
            limit = getattr(metafunc.function, "max_ranks", None)
            meshes = [m for m in self.spec.meshes if limit is None or m[0] * m[1] <= limit]
            metafunc.parametrize("tp,ep", [mesh_param(tp, ep) for tp, ep in meshes])

    @pytest.fixture(scope="class")
    @classmethod
    def cases(cls, tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
        rng = random.Random(SEED)
        root = tmp_path_factory.mktemp(f"{cls.spec.plugin}_conformance")
        built = []
        for i, (name, overrides) in enumerate(cls.spec.cases(rng).items()):
            hf = cls.spec.build_hf(seed=i, **overrides)
            checkpoint = save_checkpoint(hf, root / name)
            text = hf.config.get_text_config()
            # Sliding layers decode over a cache the window has partly masked: run well past it.
            window = getattr(text, "sliding_window", None) or 0
            length = rng.randint(max(12, 2 * window + 4), max(40, 2 * window + 16))
            ids = [rng.randrange(text.vocab_size) for _ in range(length)]
            prefill = rng.randint(1, length - 4)  # decode runs at least four steps past the prefill
            built.append(Case(name, overrides, checkpoint, hf, ids, prefill, hf_logits(hf, ids)))
        return built

    def at_mesh(self, cases: list[Case], ep: int) -> list[Case]:
        return [case for case in cases if self.spec.serves_mesh(case.name, ep)]

    def test_entry_point_resolves_the_architecture_to_this_plugin(self) -> None:
        plugin = discover_plugins()[self.spec.plugin]
        assert isinstance(plugin, ModelPlugin)
        assert plugin_for_architecture(self.spec.architecture) is plugin
        assert plugin.version == metadata.version(plugin.distribution)
        served = self.spec.hf_class.__name__
        assert served in plugin.architectures, f"{served} not in {plugin.architectures}"
        # vLLM loads general plugins by entry point: the distribution must declare one, or vLLM never
        # sees the architecture.
        declared = {
            canonical(ep.dist.name)
            for ep in metadata.entry_points(group="vllm.general_plugins")
            if ep.dist is not None
        }
        assert canonical(plugin.distribution) in declared, (
            f"{plugin.distribution} declares no vllm.general_plugins entry point"
        )

    def test_info_lists_the_plugin(self, capsys: pytest.CaptureFixture[str]) -> None:
        from ..cli import main

        assert main(["info", "--json"]) == 0
        plugin = self.spec.model_plugin
        listed = {
            "name": self.spec.plugin,
            "version": metadata.version(plugin.distribution),
            "distribution": plugin.distribution,
            "architectures": list(plugin.architectures),
            "kind": "llm",
        }
        assert listed in json.loads(capsys.readouterr().out)["plugins"]

    def test_decoder_layer_outputs_match_hf(self, cases: list[Case]) -> None:
        """Layer by layer over one prefilled sequence: names the first layer that departs from HF."""
        for case in cases:
            model = build_model(case.checkpoint, NeuronConfig(), progress=False)
            num_layers = case.hf.config.get_text_config().num_hidden_layers
            ids = torch.tensor([case.token_ids])
            expected = layer_outputs(case.hf, num_layers, lambda: case.hf(input_ids=ids))  # noqa: B023
            ours = layer_outputs(model, num_layers, lambda: teacher_forced_logits(model, case.token_ids))  # noqa: B023
            for i, (got, want) in enumerate(zip(ours, expected, strict=True)):
                error = (got - want).abs().max().item()
                # Hidden states grow through the residual stream: the tolerance scales with them.
                bound = FP32_ATOL * max(1.0, want.abs().max().item())
                assert error <= bound, f"layer {i} max abs error {error:.2e} > {bound:.2e}: {case.describe()}"

    def test_validate_passes_every_level_and_compares_every_layer(
        self, cases: list[Case], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``trnmodels validate`` on each config: L3 over every decoder layer, L2, exit 0."""
        from ..cli import main

        for case in cases:
            prompt = ",".join(map(str, case.token_ids))
            new_tokens = max(VALIDATE_MIN_NEW_TOKENS, VALIDATE_POSITIONS - len(case.token_ids))
            code = main(
                [
                    "validate",
                    str(case.checkpoint),
                    "--token-ids",
                    prompt,
                    "--prefill-len",
                    str(case.prefill_len),
                    "--new-tokens",
                    str(new_tokens),
                    "--json",
                ]
            )
            printed = capsys.readouterr()
            assert code in (0, 1), f"{case.describe()}: {printed.err}"  # 2: refused before any report
            out = json.loads(printed.out)
            assert code == 0 and out["passed"], f"{case.describe()}\n{out['report']}"
            num_layers = case.hf.config.get_text_config().num_hidden_layers
            assert [e["layer"] for e in out["L3"]["layers"]] == list(range(num_layers))
            assert {"self_attn", "input_layernorm"} <= {e["module"] for e in out["L3"]["modules"]}

    def test_teacher_forced_logits_match_hf(self, cases: list[Case], tp: int, ep: int) -> None:
        cases = self.at_mesh(cases, ep)
        jobs = [ScoreJob(str(c.checkpoint), tuple(c.token_ids), c.prefill_len) for c in cases]
        for case, ours in zip(cases, score_many(jobs, tp, ep), strict=True):
            report = compare_teacher_forced_logits(ours, case.hf_logits, atol=FP32_ATOL)
            assert report.passed, f"{case.describe(tp=tp, ep=ep)}\n{report.format_table()}"

    @at_most_two_ranks
    def test_greedy_generation_matches_hf_on_a_ragged_batch(
        self, cases: list[Case], tp: int, ep: int
    ) -> None:
        rng = random.Random(SEED + 1)
        params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
        for case in self.at_mesh(cases, ep):
            vocab = case.hf.config.get_text_config().vocab_size
            prompts = [[rng.randrange(vocab) for _ in range(n)] for n in PROMPT_LENGTHS]
            expected = [greedy_teacher_sequence(case.hf, p, NEW_TOKENS)[len(p) :] for p in prompts]
            job = GenerateJob(str(case.checkpoint), tuple(map(tuple, prompts)), params, RUNNER)
            out = generate_token_ids(job, tp, ep)
            assert [r.token_ids for r in out["results"]] == expected, case.describe(tp=tp, ep=ep)
            assert out["steps"].count("prefill_32") + out["steps"].count("prefill_64") >= 2

    @pytest.mark.slow  # a `trnmodels` process starting two ranks
    def test_cli_logits_on_two_ranks_match_hf(self, cases: list[Case], tmp_path: Path) -> None:
        """The public command: ``trnmodels logits CKPT --token-ids ... --tp/--ep ... --out F --json``."""
        tp, ep = self.spec.multi_rank_mesh
        case, out = cases[0], tmp_path / "logits.safetensors"
        done = run_cli(
            "logits", str(case.checkpoint), "--token-ids", ",".join(map(str, case.token_ids)),
            "--prefill-len", str(case.prefill_len), "--tp", str(tp), "--ep", str(ep), "--out", str(out), "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert (report["tp"], report["ep"]) == (tp, ep)
        logits = load_file(out)["logits"]
        assert logits.dtype == torch.float32 and logits.shape == case.hf_logits.shape
        error = (logits - case.hf_logits).abs().max().item()
        assert error <= FP32_ATOL, f"max abs error {error:.2e}: {case.describe(tp=tp, ep=ep)}"

    @pytest.mark.slow  # a `trnmodels` process starting two ranks
    def test_cli_generate_on_two_ranks_matches_hf_greedy(self, tmp_path: Path) -> None:
        """``trnmodels generate`` on text prompts, from the bundled tiny config with its tokenizer."""
        from transformers import AutoTokenizer

        tp, ep = self.spec.multi_rank_mesh
        tiny = self.spec.model_plugin.bundled_config_dir("tiny")
        checkpoint = save_random_checkpoint(tiny, tmp_path / "tiny")
        hf, tokenizer = self.spec.from_pretrained(checkpoint), AutoTokenizer.from_pretrained(checkpoint)
        done = run_cli(
            "generate", str(checkpoint), *itertools.chain(*(("--prompt", p) for p in CLI_PROMPTS)),
            "--max-new-tokens", "8", "--ignore-eos", "--tp", str(tp), "--ep", str(ep), "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs = json.loads(done.stdout)["outputs"]
        for prompt, out in zip(CLI_PROMPTS, outputs, strict=True):
            ids = tokenizer(prompt)["input_ids"]
            expected = greedy_teacher_sequence(hf, ids, 8)[len(ids) :]
            assert (out["prompt"], out["token_ids"]) == (prompt, expected), f"tp={tp} ep={ep}"
            assert out["text"] == tokenizer.decode(expected, skip_special_tokens=True)

    @pytest.mark.slow  # AOT compiles
    def test_compiled_graphs_generate_what_eager_generates(self, cases: list[Case], tmp_path: Path) -> None:
        from ..compile import CompileTarget, compile_all, load_compiled_graphs

        case = cases[0]
        target = CompileTarget(str(case.checkpoint), COMPILE_RUNNER)
        results = compile_all(target, str(tmp_path / "cache"), jobs=2)
        assert [r.name for r in results] == ["prefill_32", "decode_2x32"]
        model = build_model(case.checkpoint, target.neuron_config(), progress=False)
        graphs = load_compiled_graphs(target, model, str(tmp_path / "cache"))
        for params in (
            SamplingParams(max_new_tokens=9, ignore_eos=True),
            SamplingParams(max_new_tokens=9, temperature=0.7, top_k=20, seed=5, ignore_eos=True),
        ):
            compiled = Runner(model, COMPILE_RUNNER, graphs=graphs).generate(COMPILE_PROMPTS, params)
            eager = Runner(model, COMPILE_RUNNER).generate(COMPILE_PROMPTS, params)
            assert [r.token_ids for r in compiled] == [r.token_ids for r in eager], params

    @pytest.mark.slow  # AOT compiles, two gloo ranks
    def test_ranks_share_one_compiled_artifact_per_graph(self, cases: list[Case], tmp_path: Path) -> None:
        """Graphs traced once on a fake two-rank group serve both gloo ranks: each rank's shard is picked
        by the rank tensor inside the graph, not baked in."""
        from ..compile import CompileTarget, compile_all

        tp, ep = self.spec.multi_rank_mesh
        case, cache = cases[0], tmp_path / "cache"
        results = compile_all(
            CompileTarget(str(case.checkpoint), COMPILE_RUNNER, tp=tp, ep=ep), str(cache), jobs=2
        )
        assert [(r.name, r.cache) for r in results] == [("prefill_32", "miss"), ("decode_2x32", "miss")]
        assert len(list(cache.glob("*/graph.pt2"))) == 2  # one per graph, not one per rank
        params = SamplingParams(max_new_tokens=9, ignore_eos=True)
        prompts = tuple(map(tuple, COMPILE_PROMPTS))
        job = GenerateJob(str(case.checkpoint), prompts, params, COMPILE_RUNNER, cache_dir=str(cache))
        out = generate_token_ids(job, tp, ep)
        assert out["compiled_graphs"] == 2
        expected = [greedy_teacher_sequence(case.hf, list(p), 9)[len(p) :] for p in prompts]
        assert [r.token_ids for r in out["results"]] == expected, case.describe(tp=tp, ep=ep)

    def test_a_non_finite_number_in_the_config_is_refused_naming_the_field(self) -> None:
        """Every float the tiny config states, set to NaN or infinity in an in-memory config (as vLLM hands
        one over, past any file check), is refused by the plugin's validation naming that field."""
        tiny = self.spec.tiny_config()
        paths = list(float_fields(tiny))
        assert paths, "the tiny config states no float field"
        for path in paths:
            for bad in (math.nan, math.inf):
                config = self.spec.hf_class.config_class(**with_value(tiny, path, bad))
                with pytest.raises(ConfigError, match=rf"{path[-1]}: expected a finite number, got {bad}"):
                    self.spec.model_plugin.validate(config, NeuronConfig())

    def test_a_mesh_the_config_cannot_split_is_refused_before_any_rank_starts(
        self, cases: list[Case]
    ) -> None:
        checkpoint = cases[0].checkpoint
        heads = cases[0].hf.config.get_text_config().num_attention_heads
        tp = next(n for n in range(2, 2 * heads + 2) if heads % n)
        with pytest.raises((ConfigError, ShardingError), match=str(tp)):
            check_model_config(checkpoint, NeuronConfig(tp_degree=tp))
        if not self.spec.serves_mesh(cases[0].name, ep=2):
            with pytest.raises(ConfigError, match="ep_degree=2"):
                check_model_config(checkpoint, NeuronConfig(ep_degree=2))
