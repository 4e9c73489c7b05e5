"""The Trainium instances ``trnmodels plan`` sizes a model against, each figure written once, with the public
page it comes from.

A NeuronCore here is a *logical* NeuronCore: what the Neuron runtime exposes as one device, and so one rank
of a mesh. Trainium2 groups physical cores by the Logical NeuronCore Configuration (LNC); its default, 2,
makes two physical NeuronCore-v3 (and their share of the chip's HBM and bandwidth) one logical core. Trn1
has no LNC: each NeuronCore-v2 is a rank. Per-core HBM and bandwidth are the chip's divided evenly over its
logical cores (the HBM is shared on the chip; an even split is how the runtime places one rank per core).

Sources (read 2026-11):

- Trainium (trn1): https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium.html
  ("Trainium Architecture": 2 x NeuronCore-v2 per chip, 32 GiB of device memory with 820 GiB/sec) and the
  "AWS Trn1/Trn1n Architecture" page (trn1-arch.html: trn1.32xlarge has 16 Trainium chips, 512 GiB device
  memory, 13,120 GiB/sec). The EC2 product page rounds the same bandwidth as "9.8 TB/s"; the Neuron page's
  per-chip figure is used.
- Trainium2 (trn2): https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium2.html
  ("Trainium2 Architecture": eight NeuronCore-v3 per chip, 96 GiB of device memory with 2.9 TB/sec),
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn2-arch.html
  ("Amazon EC2 Trn2 Architecture": trn2.48xlarge has 16 Trainium2 chips, 1,536 GiB, 46.4 TB/sec) and
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/logical-neuroncore-config.html
  ("Logical NeuronCore configuration"; the default LNC=2, so a trn2.48xlarge shows 64 logical cores of about
  24 GiB each, as the Neuron "Best practices for training" page states). trn2.3xlarge (one Trainium2 chip)
  is listed on the EC2 Trn2 page, https://aws.amazon.com/ec2/instance-types/trn2/.
- Trainium3 (trn3) is left out: its chip is published ("Trainium3 Architecture", trainium3.html: eight
  NeuronCore-v4, 144 GiB at 4.9 TB/sec), but AWS publishes Trn3 only as UltraServers (Gen1: four servers of 16
  chips; Gen2: 36 servers of 4, trn3-arch.html), with no instance name or default LNC to plan one against.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

GIB = 1 << 30
TB = 10**12


@dataclass(frozen=True)
class Instance:
    """One EC2 instance size: its chips, and what each chip has. ``lnc`` physical cores form a logical one."""

    name: str
    chip: str
    chips: int
    physical_cores_per_chip: int
    lnc: int
    hbm_bytes_per_chip: int
    hbm_bandwidth_per_chip: float  # bytes per second
    source: str

    @property
    def cores_per_chip(self) -> int:
        """Logical NeuronCores per chip: the ranks a chip runs."""
        return self.physical_cores_per_chip // self.lnc

    @property
    def cores(self) -> int:
        """Logical NeuronCores in the instance: the largest mesh it runs."""
        return self.chips * self.cores_per_chip

    @property
    def hbm_bytes_per_core(self) -> int:
        return self.hbm_bytes_per_chip // self.cores_per_chip

    @property
    def hbm_bandwidth_per_core(self) -> float:
        return self.hbm_bandwidth_per_chip / self.cores_per_chip

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "chip": self.chip,
            "chips": self.chips,
            "physical_cores_per_chip": self.physical_cores_per_chip,
            "logical_neuroncore_config": self.lnc,
            "cores": self.cores,
            "hbm_bytes_per_chip": self.hbm_bytes_per_chip,
            "hbm_bytes_per_core": self.hbm_bytes_per_core,
            "hbm_bandwidth_per_chip": self.hbm_bandwidth_per_chip,
            "hbm_bandwidth_per_core": self.hbm_bandwidth_per_core,
            "source": self.source,
        }


_TRAINIUM = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium.html"
)
_TRAINIUM2 = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium2.html"
)
_TRN2_LNC = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/"
    "logical-neuroncore-config.html"
)

INSTANCES: dict[str, Instance] = {
    i.name: i
    for i in (
        Instance(
            name="trn1.32xlarge",
            chip="Trainium",
            chips=16,
            physical_cores_per_chip=2,
            lnc=1,  # NeuronCore-v2 has no logical grouping
            hbm_bytes_per_chip=32 * GIB,
            hbm_bandwidth_per_chip=820 * GIB,  # "820 GiB/sec"
            source=f"{_TRAINIUM} (Trainium Architecture); trn1-arch.html (Trn1/Trn1n Architecture)",
        ),
        Instance(
            name="trn2.3xlarge",
            chip="Trainium2",
            chips=1,
            physical_cores_per_chip=8,
            lnc=2,
            hbm_bytes_per_chip=96 * GIB,
            hbm_bandwidth_per_chip=2.9 * TB,
            source=f"{_TRAINIUM2} (Trainium2 Architecture); https://aws.amazon.com/ec2/instance-types/trn2/; "
            f"{_TRN2_LNC}",
        ),
        Instance(
            name="trn2.48xlarge",
            chip="Trainium2",
            chips=16,
            physical_cores_per_chip=8,
            lnc=2,
            hbm_bytes_per_chip=96 * GIB,
            hbm_bandwidth_per_chip=2.9 * TB,
            source=f"{_TRAINIUM2} (Trainium2 Architecture); trn2-arch.html (Amazon EC2 Trn2 Architecture); "
            f"{_TRN2_LNC}",
        ),
    )
}


def get_instance(name: str) -> Instance:
    """The instance called ``name``; an unknown name is refused with the known ones."""
    try:
        return INSTANCES[name]
    except KeyError:
        raise ConfigError(
            f"--instance: unknown instance {name!r}; known: {', '.join(INSTANCES)} "
            "(trn3 is left out: AWS publishes no Trn3 instance size yet)"
        ) from None
