"""Stages 1 and 2 of onboarding as one command: ``trnmodels new NAME --from TEMPLATE --architecture ARCH``.

It writes ``models/NAME/`` from a template plugin (``llama3`` for a dense model, ``gpt_oss`` for a
mixture of experts): the template's plugin object, model and factory with its names replaced, a tiny
config shrunk (sizes only) from the architecture's bundled published config or, if none is bundled, from
transformers' default config of that architecture, and the tests: core's conformance suite against the
transformers class of ARCH (module-level layer outputs, teacher-forced logits at TP=1 and TP=2, greedy
generation against HF, bad config input), plus pyproject (version 0.1.0, core's range, the
``trnmodels.models`` and ``vllm.general_plugins`` entry points), README, CHANGELOG and a model card stub.
The member joins the uv workspace (the root ``pyproject.toml``) and the lock is refreshed; the nox
sessions find ``models/*`` by themselves.

A scaffold is a start, not a port: what the template's code does not cover (a bias the template has not,
a norm placed elsewhere) fails in the generated tests with the checkpoint key or the layer that differs;
``trnmodels diff`` names it beforehand.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError
from ..published import PUBLISHED_DIR, published_names
from ..testing.published import shrink

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*[a-z0-9]$")
ARCH_SUFFIX = "ForCausalLM"

# Sizes of a tiny config (the bundled templates' own): small enough for tests in seconds, large enough
# for TP=2 and EP=2. Only fields the published config has are set.
TINY_SIZES: Mapping[str, Any] = {
    "vocab_size": 320,  # the test tokenizer's
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
}
TINY_WINDOW = 16  # a sliding window, where the published config has one
# The test tokenizer's special ids, set whether or not the published config names them (Mistral's and
# Mixtral's have no pad_token_id; a random checkpoint's tokenizer needs one).
TINY_TOKEN_IDS: Mapping[str, int] = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}


@dataclass(frozen=True)
class Template:
    """A plugin a scaffold is copied from: the files taken over, and the names in them to replace."""

    name: str
    kind: str  # "dense" or "moe"
    files: tuple[str, ...]  # under src/trnmodels/<name>/
    class_prefix: str  # our classes and HF's share it: LlamaForCausalLM, LlamaDecoderLayer
    display: str
    model_type: str


TEMPLATES: Mapping[str, Template] = {
    "llama3": Template(
        "llama3", "dense", ("__init__.py", "model.py", "factory.py"), "Llama", "Llama 3", "llama"
    ),
    "gpt_oss": Template(
        "gpt_oss",
        "moe",
        ("__init__.py", "config.py", "model.py", "factory.py"),
        "GptOss",
        "gpt-oss",
        "gpt_oss",
    ),
}


def distribution(name: str) -> str:
    return f"trnmodels-{name.replace('_', '-')}"


def model_type_of(architecture: str) -> str:
    """The ``model_type`` transformers builds ``architecture`` from (its causal-LM auto mapping)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for model_type, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if cls == architecture:
            return model_type
    known = sorted(c for c in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if c.endswith(ARCH_SUFFIX))
    near = [c for c in known if c[:3].lower() == architecture[:3].lower()][:8]
    raise InputError(
        f"--architecture: {architecture!r} is not a causal-LM class transformers knows"
        + (f" (similar: {', '.join(near)})" if near else "")
    )


def base_config(architecture: str) -> tuple[dict[str, Any], str]:
    """The architecture's published config bundled with core (the first by name), else transformers'
    default config for it, and where it came from."""
    for name in published_names():
        config = json.loads((PUBLISHED_DIR / name / "config.json").read_text())
        if (config.get("architectures") or [None])[0] == architecture:
            return config, f"the bundled published config {name}"
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type_of(architecture)).to_dict()
    config["architectures"] = [architecture]
    for noise in ("transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        config.pop(noise, None)
    return config, f"transformers' default {type(AutoConfig.for_model(model_type_of(architecture))).__name__}"


def tiny_config(architecture: str) -> tuple[dict[str, Any], str]:
    """A tiny config of the architecture: its base config with only the sizes changed."""
    config, source = base_config(architecture)
    sizes = {k: v for k, v in TINY_SIZES.items() if k in config} | dict(TINY_TOKEN_IDS)
    if isinstance(config.get("sliding_window"), int):
        sizes["sliding_window"] = TINY_WINDOW
    if isinstance(config.get("layer_types"), list):
        sizes["layer_types"] = config["layer_types"][: TINY_SIZES["num_hidden_layers"]]
    return shrink(config, sizes), source


def _replace_docstring(source: str, docstring: str) -> str:
    tree = ast.parse(source)
    first = tree.body[0] if tree.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        lines = source.splitlines(keepends=True)
        return f'"""{docstring}"""\n' + "".join(lines[first.end_lineno :])
    return f'"""{docstring}"""\n\n' + source


def renamer(template: Template, name: str, architecture: str, model_type: str):
    """The text substitutions that turn the template's files into the new plugin's."""
    prefix = architecture.removesuffix(ARCH_SUFFIX)
    pairs = [
        (f"trnmodels.{template.name}", f"trnmodels.{name}"),
        (distribution(template.name), distribution(name)),
        (f"trnmodels_{template.name}", f"trnmodels_{name}"),
        (f"{template.name} = ", f"{name} = "),  # the trnmodels.models entry point
        (template.display, prefix),
        (template.class_prefix, prefix),
    ]
    # The plugin's name and model_type, only where the declaration states them (the same words elsewhere,
    # such as the "llama3" RoPE type, are not names).
    declared_name = re.compile(rf'(ModelPlugin\.declare\(\s*)"{re.escape(template.name)}"')
    declared_type = re.compile(rf'("{re.escape(architecture)}":\s*)"{re.escape(template.model_type)}"')

    def rename(text: str) -> str:
        for old, new in pairs:
            text = text.replace(old, new)
        text = declared_name.sub(lambda m: f'{m.group(1)}"{name}"', text)
        return declared_type.sub(lambda m: f'{m.group(1)}"{model_type}"', text)

    return rename


def test_conformance_source(name: str, architecture: str, kind: str) -> str:
    moe = "\n    moe=True," if kind == "moe" else ""
    return f'''"""{architecture} against transformers' {architecture} through core's plugin conformance suite
(scaffolded by `trnmodels new`: add the variants the published checkpoints use to ``configs``)."""

from __future__ import annotations

import transformers

from trnmodels.core.testing.conformance import CausalLMConformance, ConformanceSpec

SPEC = ConformanceSpec(
    plugin="{name}",
    hf_class=transformers.{architecture},
    configs={{"tiny": {{}}, "mqa_tied": dict(num_key_value_heads=1, tie_word_embeddings=True)}},{moe}
)


class TestConformance(CausalLMConformance):
    spec = SPEC
'''


def conftest_source(architecture: str) -> str:
    return f'''"""Tiny random checkpoints of the bundled tiny config (the conformance spec builds them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import transformers

from .test_conformance import SPEC

hf_config = SPEC.hf_config
build_hf = SPEC.build_hf


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., tuple[Path, transformers.{architecture}]]:
    return SPEC.checkpoint_factory(tmp_path)
'''


def test_errors_source(name: str) -> str:
    return f'''"""What the plugin refuses that core does not: a quantized checkpoint it has no kernels for."""

from __future__ import annotations

import json

import pytest

from trnmodels.core.causal_lm import build_model
from trnmodels.core.errors import ConfigError
from trnmodels.core.runtime_config import NeuronConfig


def test_an_unsupported_quantization_is_refused(make_checkpoint):
    ckpt, _ = make_checkpoint()
    path = ckpt / "config.json"
    quant = {{"quant_method": "awq", "bits": 4}}
    path.write_text(json.dumps({{**json.loads(path.read_text()), "quantization_config": quant}}))
    with pytest.raises(ConfigError, match="quant_method='awq' is not supported by {distribution(name)}"):
        build_model(ckpt, NeuronConfig(), load=False)
'''


def pyproject_source(template_dir: Path, template: Template, name: str, architecture: str, rename) -> str:
    text = rename((template_dir / "pyproject.toml").read_text())
    text = re.sub(r'^version = ".*"$', 'version = "0.1.0"', text, count=1, flags=re.M)
    return re.sub(
        r"^description = .*$",
        f'description = "{architecture} for vLLM on AWS Trainium (scaffolded from trnmodels-'
        f'{template.name.replace("_", "-")})."',
        text,
        count=1,
        flags=re.M,
    )


def docs_sources(name: str, architecture: str, template: Template, config_source: str) -> dict[str, str]:
    dist = distribution(name)
    return {
        "README.md": f"""# {dist}

{architecture} for vLLM on AWS Trainium, built on `trnmodels-core`; scaffolded from
`{distribution(template.name)}` by `trnmodels new` (its tiny config from {config_source}).

```bash
nox -s tests-{name}                    # the conformance suite against transformers' {architecture}
trnmodels validate /path/to/checkpoint  # L3, L2 (and L1 with --tasks) on a real checkpoint
```
""",
        "CHANGELOG.md": f"""# Changelog

All notable changes to `{dist}` are documented in this file.

The format is based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/),
and this project adheres to [Semantic Versioning](https://semver.org/spec/v2.0.0.html).

## [0.1.0] - Unreleased

### Added
- Scaffolded from `{distribution(template.name)}` by `trnmodels new --architecture {architecture}`.
""",
        "MODEL_CARD.md": f"""# {architecture} on Trainium ({dist})

- Architecture: `{architecture}`; template: `{template.name}` ({template.kind}).
- Checkpoints served: to be listed, with their published configs.
- Validation: `trnmodels validate CKPT` results per checkpoint, to be recorded.
- Known limits: to be written.
""",
    }


def add_workspace_member(root: Path, name: str) -> str:
    """The root pyproject with the new distribution in the dev group and the workspace sources."""
    dist = distribution(name)
    text = (root / "pyproject.toml").read_text()
    if f'"{dist}"' in text:
        raise InputError(f"{root / 'pyproject.toml'} already names {dist}")
    text = text.replace('    "trnmodels-core",\n', f'    "trnmodels-core",\n    "{dist}",\n', 1)
    return text.replace(
        "trnmodels-core = { workspace = true }\n",
        f"trnmodels-core = {{ workspace = true }}\n{dist} = {{ workspace = true }}\n",
        1,
    )


def check_new(root: Path, name: str, template: str, architecture: str) -> tuple[Template, str]:
    if not NAME_PATTERN.match(name) or "__" in name:
        raise InputError(
            f"NAME: {name!r} is not a valid plugin name (lowercase letters, digits and single underscores, "
            "starting with a letter: it becomes the package trnmodels.NAME and the distribution trnmodels-NAME)"
        )
    if template not in TEMPLATES:
        raise InputError(f"--from: unknown template {template!r}; templates: {', '.join(TEMPLATES)}")
    if not architecture.endswith(ARCH_SUFFIX):
        raise InputError(f"--architecture: expected a causal-LM class (…{ARCH_SUFFIX}), got {architecture!r}")
    model_type = model_type_of(architecture)
    if not (root / "pyproject.toml").is_file() or not (root / "models" / template).is_dir():
        raise InputError(f"{root}: not the trnmodels workspace (no pyproject.toml and models/{template}/)")
    target = root / "models" / name
    if target.exists():
        raise InputError(f"{target} already exists; choose another NAME or remove it")
    return TEMPLATES[template], model_type


def scaffold(
    root: str | Path, name: str, template: str, architecture: str, *, lock: bool = True
) -> dict[str, Any]:
    """Write ``root/models/NAME`` and add it to the workspace; nothing is left half-written on failure."""
    root = Path(root).resolve()
    tpl, model_type = check_new(root, name, template, architecture)
    config, config_source = tiny_config(architecture)
    if (config.get("architectures") or [None])[0] != architecture:
        raise ConfigError(f"{config_source}: architectures[0] is not {architecture}")
    template_dir = root / "models" / tpl.name
    rename = renamer(tpl, name, architecture, model_type)
    files: dict[str, str] = {
        "pyproject.toml": pyproject_source(template_dir, tpl, name, architecture, rename),
        **docs_sources(name, architecture, tpl, config_source),
        "tests/__init__.py": "",
        "tests/conftest.py": conftest_source(architecture),
        "tests/test_conformance.py": test_conformance_source(name, architecture, tpl.kind),
        "tests/test_errors.py": test_errors_source(name),
        f"src/trnmodels/{name}/tiny/config.json": json.dumps(config, indent=2) + "\n",
    }
    for file in tpl.files:
        text = rename((template_dir / "src" / "trnmodels" / tpl.name / file).read_text())
        what = {"__init__.py": "the plugin's description", "model.py": "the model", "factory.py": "its factory",
                "config.py": "its config"}[file]  # fmt: skip
        files[f"src/trnmodels/{name}/{file}"] = _replace_docstring(
            text, f"{architecture} on trnmodels core: {what}, scaffolded from the {tpl.name} template."
        )
    if not (template_dir / "tests" / "__init__.py").exists():
        del files["tests/__init__.py"]
    root_pyproject = add_workspace_member(root, name)
    target = root / "models" / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root / "models"))
    old_pyproject = (root / "pyproject.toml").read_text()
    old_lock = (root / "uv.lock").read_text() if (root / "uv.lock").is_file() else None
    try:
        for rel, text in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        staging.rename(target)
        (root / "pyproject.toml").write_text(root_pyproject)
        if lock:
            relock(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        (root / "pyproject.toml").write_text(old_pyproject)
        if old_lock is not None:
            (root / "uv.lock").write_text(old_lock)
        raise
    return {
        "plugin": name,
        "distribution": distribution(name),
        "architecture": architecture,
        "model_type": model_type,
        "template": tpl.name,
        "folder": str(target),
        "tiny_config_from": config_source,
        "files": sorted(files),
        "locked": lock,
        "next": f"nox -s tests-{name}",
    }


def relock(root: Path) -> None:
    """``uv lock`` in the workspace; its failure is one line."""
    uv = shutil.which("uv")
    if uv is None:
        raise ConfigError(
            "uv is not on PATH: the workspace lock cannot be refreshed (run `uv lock` yourself)"
        )
    done = subprocess.run([uv, "lock"], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        reason = " ".join(done.stderr.split())[:400] or f"exit status {done.returncode}"
        raise ConfigError(f"uv lock failed in {root}: {reason}")
