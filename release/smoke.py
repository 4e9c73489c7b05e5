"""The smoke test of an installed plugin, run by the fresh environment's Python from outside the
repository: ``python smoke.py PLUGIN KIND PLUGIN_VERSION CORE_VERSION WORK_DIR``.

Standalone on purpose (it imports nothing from the repository): it sees only what the user's
installation holds. Prints one JSON line with what it found; exits non-zero naming the first failure.
"""

import json
import subprocess
import sys
import tempfile
from importlib import metadata, resources
from pathlib import Path

TOKEN_IDS = [5, 17, 42, 9, 33, 71, 12, 60]  # below every tiny config's vocabulary; not the special ids 0-2


def trnmodels(*args: str) -> str:
    exe = Path(sys.executable).with_name("trnmodels")
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"`trnmodels {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return proc.stdout


def check_info(plugin: str, version: str, core_version: str) -> dict:
    info = json.loads(trnmodels("info", "--json"))
    if info["core_version"] != core_version:
        sys.exit(f"trnmodels info: core {info['core_version']}, expected {core_version}")
    listed = {p["name"]: p["version"] for p in info["plugins"]}
    if plugin != "core" and listed.get(plugin) != version:
        sys.exit(f"trnmodels info lists {listed}, expected {plugin} {version}")
    return listed


def check_llm(plugin: str, work: Path) -> dict:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from trnmodels.core.testing.checkpoints import save_random_checkpoint

    tiny = resources.files(f"trnmodels.{plugin}") / "tiny"
    checkpoint = save_random_checkpoint(Path(str(tiny)), work / "checkpoint", seed=0)
    out = work / "logits.safetensors"
    trnmodels("logits", str(checkpoint), "--token-ids", ",".join(map(str, TOKEN_IDS)), "--out", str(out))
    ours = load_file(out)["logits"]
    reference = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        expected = reference.eval()(torch.tensor([TOKEN_IDS])).logits[0].float()
    error = (ours - expected).abs().max().item()
    if not torch.isfinite(ours).all() or error > 1e-4 + 1e-4 * expected.abs().max().item():
        sys.exit(f"trnmodels logits differs from transformers by {error:.3g} on the tiny config")
    distribution = f"trnmodels-{plugin.replace('_', '-')}"
    declared = {
        ep.value
        for ep in metadata.entry_points(group="vllm.general_plugins")
        if ep.dist is not None and ep.dist.name.replace("_", "-") == distribution
    }
    if declared != {"trnmodels.core.vllm.registration:register"}:
        sys.exit(f"{distribution}'s vllm.general_plugins entry points are {sorted(declared)}")
    return {"logits_max_abs_error": error, "vllm_entry_point": True}


def random_pipeline(tiny: Path, out: Path) -> Path:
    """A pipeline with random weights built from the bundled tiny configs (``model_index.json`` names
    each component's library and class) and a tokenizer trained here, saved by diffusers."""
    import diffusers
    import torch
    import transformers

    from trnmodels.core.testing.checkpoints import train_tokenizer

    index = json.loads((tiny / "model_index.json").read_text())
    torch.manual_seed(0)
    components, options = {}, {}
    for name, value in index.items():
        if name.startswith("_"):
            continue
        if not (isinstance(value, list) and len(value) == 2):
            options[name] = value
        elif value[1] is None:
            components[name] = None
        elif "Tokenizer" in value[1]:
            components[name] = train_tokenizer()
        elif value[0] == "diffusers":
            cls = getattr(diffusers, value[1])
            components[name] = cls.from_config(cls.load_config(tiny / name))
        else:
            config = transformers.AutoConfig.from_pretrained(tiny / name)
            components[name] = getattr(transformers, value[1])(config).eval()
    pipeline = getattr(diffusers, index["_class_name"])(**components, **options)
    pipeline.save_pretrained(out)
    return out


def check_diffusion(plugin: str, work: Path) -> dict:
    tiny = Path(str(resources.files(f"trnmodels.{plugin}") / "tiny"))
    checkpoint = random_pipeline(tiny, work / "pipeline")
    report = json.loads(trnmodels("validate", str(checkpoint), "--json"))
    if not report["passed"]:
        sys.exit(f"trnmodels validate on a random pipeline of the tiny configs failed:\n{report['report']}")
    return {"validate": "PASS"}


def main() -> None:
    plugin, kind, version, core_version, work = sys.argv[1:6]
    listed = check_info(plugin, version, core_version)
    checks = {"core": lambda plugin, work: {}, "llm": check_llm, "diffusion": check_diffusion}
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        found = checks[kind](plugin, Path(tmp))
    print(json.dumps({"plugins": listed, **found}))


if __name__ == "__main__":
    main()
