"""Generate a Wan2.2 video from a stage YAML.

    python examples/wan22/run.py CHECKPOINT_DIR --prompt TEXT [--stage-config wan22_stage.yaml] \
        [--out video.mp4] [--engine local|omni] [--dev]

``--engine local`` (the default) runs the trnmodels pipeline directly on ``tp x cp x cfg`` local ranks
(gloo on CPU): what this repository can execute and test. ``--engine omni`` hands the same stage YAML to
vLLM-Omni's ``Omni`` engine, which resolves ``model_class_name`` through the plugin registration
(``trnmodels.core.omni``); that path needs vLLM-Omni's full runtime (torchvision, a device) and is not
exercised here. ``--dev`` shrinks the video to a smoke test (17 frames of 256x256, 4 steps).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).parent
DEV = {"num_frames": 17, "height": 256, "width": 256, "num_inference_steps": 4}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint_dir", type=Path)
    parser.add_argument("--prompt", default="A cat walks on the grass, realistic")
    parser.add_argument("--negative-prompt", default=None)
    parser.add_argument("--stage-config", type=Path, default=HERE / "wan22_stage.yaml")
    parser.add_argument("--out", type=Path, default=Path("wan22.mp4"))
    parser.add_argument("--engine", choices=("local", "omni"), default="local")
    parser.add_argument("--dev", action="store_true", help="a small, fast video")
    args = parser.parse_args()

    from trnmodels.core.omni.stage_config import DiffusionStageConfig

    stage = DiffusionStageConfig.from_yaml(args.stage_config)
    params = {**stage.sampling, **(DEV if args.dev else {})}
    if args.engine == "omni":
        return run_omni(args, params)
    from trnmodels.core.cli import main as trnmodels

    return trnmodels(
        [
            "video",
            str(args.checkpoint_dir),
            "--prompt",
            args.prompt,
            *(["--negative-prompt", args.negative_prompt] if args.negative_prompt else []),
            "--num-frames",
            str(params["num_frames"]),
            "--height",
            str(params["height"]),
            "--width",
            str(params["width"]),
            "--steps",
            str(params["num_inference_steps"]),
            "--seed",
            str(params.get("seed", 0)),
            "--guidance-scale",
            str(params.get("guidance_scale", 5.0)),
            *(
                ["--guidance-scale-2", str(params["guidance_scale_2"])]
                if "guidance_scale_2" in params
                else []
            ),
            "--tp",
            str(stage.tp),
            "--cp",
            str(stage.cp),
            "--cfg-parallel",
            str(stage.cfg_parallel),
            "--dtype",
            stage.dtype,
            "--out",
            str(args.out),
        ]
    )


def run_omni(args: argparse.Namespace, params: dict) -> int:
    """vLLM-Omni's engine with this stage YAML (needs vLLM-Omni's runtime; not runnable on CPU here)."""
    from vllm_omni.entrypoints.omni import Omni

    omni = Omni(
        model=str(args.checkpoint_dir), stage_configs_path=str(args.stage_config), stage_init_timeout=3600
    )
    outputs = omni.generate(
        {"prompt": args.prompt, "negative_prompt": args.negative_prompt},
        {k: v for k, v in params.items() if k != "max_sequence_length"},
    )
    print(outputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
