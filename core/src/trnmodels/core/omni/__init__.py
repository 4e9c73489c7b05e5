"""The vLLM-Omni front end: how vLLM-Omni finds, builds and serves the diffusion plugins' pipelines.

- ``registry``: the installed pipelines, every diffusion plugin's ``PIPELINE_REGISTRY`` (entry point
  group ``trnmodels.diffusion``), and what a launcher reads from a pipeline class before it starts ranks;
- ``registration``: the ``vllm_omni.general_plugins`` hook registering them with vLLM-Omni;
- ``engine``: vLLM-Omni's diffusion engine contract, met by any diffusers-style pipeline;
- ``stage_config``: the diffusion stage YAML (mesh, model options, default video) a deployment serves.

vLLM-Omni is imported only inside the functions that call it, and importing this package imports
no torch and no vLLM-Omni: ``trnmodels video`` reads the registry without them.
"""

# The ``vllm_omni.general_plugins`` entry point is ``trnmodels.core.omni:register``: the package is
# the name vLLM-Omni's installed metadata holds, ``registration`` the module that implements it.
from .registration import register

__all__ = ["register"]
