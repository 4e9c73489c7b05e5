"""Plugin discovery. Each model distribution announces itself in the ``trnmodels.models`` entry-point group.

A plugin's entry point resolves to a ``ModelPlugin``: a name, the HF architectures it serves (and the
``model_type`` each one's config has), and the ``"module:function"`` of its factory. The factory's module
may define ``validate(hf_config, neuron_config)``: it checks a config against a runtime config without
building anything, so launchers refuse a bad TP/EP degree before starting ranks. Nothing here imports
torch or the model code, so listing plugins is cheap; the factory is imported only when a model is built.
Adding a model is adding a folder.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import ConfigError

ENTRY_POINT_GROUP = "trnmodels.models"

# The fields every decoder's config.json states (transformers would default a missing one silently).
DECODER_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "rms_norm_eps",
)


@dataclass(frozen=True)
class ModelPlugin:
    name: str
    architectures: tuple[str, ...]
    factory: str
    distribution: str = ""
    # Fields config.json must state itself: transformers would otherwise default them silently.
    required_config_fields: tuple[str, ...] = ()
    # The config.json ``model_type`` of each architecture (transformers picks the config class from
    # ``model_type`` alone, so a contradicting pair would build the wrong config silently).
    model_types: Mapping[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def declare(
        cls,
        name: str,
        model_types: Mapping[str, str],
        *,
        factory: str | None = None,
        required_config_fields: tuple[str, ...] = (),
    ) -> ModelPlugin:
        """The plugin of package ``trnmodels.<name>`` (distribution ``trnmodels-<name>``, ``_`` written
        ``-``) serving each architecture of ``model_types`` (architecture → its config's ``model_type``),
        built by ``factory`` (default ``trnmodels.<name>.factory:build``)."""
        return cls(
            name=name,
            architectures=tuple(model_types),
            factory=factory or f"trnmodels.{name}.factory:build",
            distribution=f"trnmodels-{name.replace('_', '-')}",
            required_config_fields=required_config_fields,
            model_types=dict(model_types),
        )

    def check_model_type(self, architecture: str, model_type: object, where: str = "") -> None:
        """Refuse a ``model_type`` that is not the declared one for ``architecture``."""
        expected = self.model_types.get(architecture)
        if expected is not None and model_type != expected:
            raise ConfigError(
                f"{where}model_type {model_type!r} contradicts architectures[0] {architecture!r} "
                f"(whose model_type is {expected!r})"
            )

    def validate(self, hf_config: Any, neuron_config: Any) -> None:
        """Run the factory module's ``validate(hf_config, neuron_config)``, if it has one (no weights,
        no parallel state)."""
        module = importlib.import_module(self.factory.partition(":")[0])
        check = getattr(module, "validate", None)
        if check is not None:
            check(hf_config, neuron_config)

    @property
    def package(self) -> str:
        """The plugin's import package, e.g. ``trnmodels.llama3``."""
        return self.factory.partition(":")[0].rpartition(".")[0]

    def bundled_config_dir(self, name: str) -> Path:
        """A config shipped inside the plugin package: ``tiny`` (tests, demo, default compile) or ``bench``
        (the about-100M-parameter benchmark config). The directory holds a ``config.json``."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"plugin {self.name}: package {self.package} is not importable")
        path = Path(next(iter(spec.submodule_search_locations))) / name
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"plugin {self.name} bundles no {name!r} config (looked for {path / 'config.json'})"
            )
        return path

    def load_factory(self) -> Callable[..., Any]:
        module, _, attr = self.factory.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def version(self) -> str:
        try:
            return metadata.version(self.distribution) if self.distribution else "unknown"
        except metadata.PackageNotFoundError:
            return "unknown"


def discover_plugins() -> dict[str, ModelPlugin]:
    """Installed plugins by name, in name order."""
    found: dict[str, ModelPlugin] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        plugin = ep.load()
        if not isinstance(plugin, ModelPlugin):
            raise ConfigError(
                f"entry point {ep.name} = {ep.value}: expected a ModelPlugin, got {type(plugin).__name__}"
            )
        found[plugin.name] = plugin
    return dict(sorted(found.items()))


def plugin_for_architecture(architecture: str) -> ModelPlugin:
    plugins = discover_plugins()
    for plugin in plugins.values():
        if architecture in plugin.architectures:
            return plugin
    served = {a: p.name for p in plugins.values() for a in p.architectures}
    raise ConfigError(
        f"architecture {architecture!r} is served by no installed trnmodels plugin; "
        f"installed: {served or 'none'} (pip install the plugin for this model)"
    )
