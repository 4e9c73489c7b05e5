"""``python -m trnmodels.wan22.compile [CHECKPOINT_DIR] [--stage-config YAML]``: the per-component compile.

What ``nox -s compile-wan22`` runs. Every graph of one generation is compiled into the artifact cache under
its own model name: the text encoder, each DiT expert, the VAE decoder, and the VAE encoder when the
checkpoint is image-to-video. Only configs are read: the components are built with uninitialised
weights on a fake process group of the stage's mesh, so a 14B checkpoint compiles without loading
(or even having) its weights. With no argument it compiles the bundled tiny config and its stage YAML;
a second run is all cache hits.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from trnmodels.core.compile.diffusion import ComponentGraph, compile_components, format_table
from trnmodels.core.errors import ConfigError, TrnModelsError
from trnmodels.core.omni.registry import checkpoint_architecture, conditions_on_image
from trnmodels.core.omni.stage_config import DiffusionStageConfig
from trnmodels.core.parallel.state import ParallelLayout

TINY = Path(__file__).parent / "tiny"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def read_index(checkpoint_dir: Path) -> dict:
    path = checkpoint_dir / "model_index.json"
    if not path.is_file():
        raise ConfigError(f"{checkpoint_dir}: no model_index.json (expected a diffusers Wan2.2 checkpoint)")
    return json.loads(path.read_text())


def component_graphs(checkpoint_dir: str | Path, stage: DiffusionStageConfig) -> list[ComponentGraph]:
    """Every graph of the stage's default video, from the checkpoint's configs alone."""
    from trnmodels.wan22.text_encoder import UMT5Config, text_encoder_component_graph
    from trnmodels.wan22.transformer import WanDiTConfig, dit_component_graph
    from trnmodels.wan22.vae import Wan22VAE

    checkpoint_dir = Path(checkpoint_dir)
    index = read_index(checkpoint_dir)
    video = stage.video()
    text_len = video.get("max_sequence_length", 512)
    dtype = DTYPES[stage.dtype]
    # The DiT and the text encoder run on the TP x CP mesh; the CFG dimension replicates them.
    layout = ParallelLayout(tp=stage.tp, cp=stage.cp)
    graphs = [
        text_encoder_component_graph(
            UMT5Config.from_pretrained(checkpoint_dir / "text_encoder"),
            batch_size=1,
            seq_len=text_len,
            dtype=dtype,
            layout=ParallelLayout(tp=stage.tp),
        )
    ]
    vae = Wan22VAE.from_config(Wan22VAE.load_config(checkpoint_dir / "vae")).eval()
    frames, lat_h, lat_w = vae.latent_size(video["num_frames"], video["height"], video["width"])
    model_config = {k: v for k, v in stage.model_config.items() if k == "enable_ring_attention"}
    for name in ("transformer", "transformer_2"):
        if index.get(name) and index[name][0] is not None and (checkpoint_dir / name).is_dir():
            graphs.append(
                dit_component_graph(
                    WanDiTConfig.from_pretrained(checkpoint_dir / name, **model_config),
                    model_name=f"wan22_{name}",
                    batch_size=1,
                    latent_shape=(frames, lat_h, lat_w),
                    text_len=text_len,
                    dtype=dtype,
                    layout=layout,
                )
            )
    if stage.vae_use_tiling:
        vae.enable_tiling()
    vae.vae_patch_parallel_size = stage.vae_patch_parallel_size
    graphs += vae.component_graphs(
        num_frames=video["num_frames"],
        height=video["height"],
        width=video["width"],
        # An image-to-video pipeline (as its class declares) runs the VAE encoder too.
        compile_encoder=conditions_on_image(checkpoint_architecture(checkpoint_dir)),
    )
    return graphs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trnmodels.wan22.compile", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "checkpoint_dir", nargs="?", type=Path, default=TINY, help="default: the bundled tiny config"
    )
    parser.add_argument(
        "--stage-config", type=Path, default=None, help="default: <checkpoint>/stage.yaml or tiny's"
    )
    parser.add_argument("--cache-dir", default=None, help="default: $TRNMODELS_CACHE_DIR or ~/.cache")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    stage_path = args.stage_config or next(
        p for p in (args.checkpoint_dir / "stage.yaml", TINY / "stage.yaml") if p.is_file()
    )
    try:
        stage = DiffusionStageConfig.from_yaml(stage_path)
        graphs = component_graphs(args.checkpoint_dir, stage)

        def progress(result) -> None:
            if not args.json:
                print(
                    f"  {result.name:<28} {result.cache:<5} {result.seconds:8.2f} s",
                    file=sys.stderr,
                    flush=True,
                )

        results = compile_components(graphs, args.cache_dir, progress)
    except TrnModelsError as e:
        print(f"compile-wan22: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"graphs": [r.to_dict() for r in results], "stage_config": str(stage_path)}))
    else:
        print(f"{args.checkpoint_dir} with {stage_path} ({stage.dtype}, tp={stage.tp} cp={stage.cp})")
        print(format_table(results, args.cache_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
