"""trnmodels-wan22: Wan2.2 text-to-video and image-to-video for vLLM-Omni on AWS Trainium.

Importing this package is cheap (no torch, no diffusers): it only names the pipelines. A pipeline
module is imported when something resolves its ``"module:Class"`` string.
"""

from importlib.metadata import version

# The one version is the distribution's (pyproject.toml): a release bumps it there only.
__version__ = version("trnmodels-wan22")

# Architecture key -> "module:Class" of the class vLLM-Omni's diffusion engine instantiates for it (the
# engine contract, ``trnmodels.core.omni.engine``); its ``pipeline_class`` is the diffusers-style
# pipeline that local runners (``trnmodels video``, the examples) build with ``from_pretrained``. The keys
# are what a stage YAML's ``model_class_name`` or a checkpoint's ``model_index.json`` ``_class_name``
# resolves to: diffusers' names (``WanPipeline``, ``WanImageToVideoPipeline``) and vLLM-Omni's
# (``Wan22Pipeline``, ``Wan22I2VPipeline``).
PIPELINE_REGISTRY: dict[str, str] = {
    "WanPipeline": "trnmodels.wan22.omni:Wan22OmniPipeline",
    "Wan22Pipeline": "trnmodels.wan22.omni:Wan22OmniPipeline",
    "WanImageToVideoPipeline": "trnmodels.wan22.omni:Wan22I2VOmniPipeline",
    "Wan22I2VPipeline": "trnmodels.wan22.omni:Wan22I2VOmniPipeline",
}

__all__ = ["PIPELINE_REGISTRY", "__version__"]
