"""What kforge knows about a GPU: the fingerprint stored with a session and shown in prompts."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GpuInfo:
    name: str
    arch: str  # "sm_90", "sm_121"
    sm_count: int = 0
    memory_gb: float = 0.0
    l2_mb: float = 0.0
    bandwidth_gbs: float | None = None  # measured device-to-device copy rate (read + write)
    driver: str = ""
    torch: str = ""
    index: int = 0

    @property
    def label(self) -> str:
        return f"{self.name} ({self.arch})"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GpuInfo:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


# The stand-in used where no GPU was found (CPU-only tests and sessions browsed offline).
NO_GPU = GpuInfo(name="no GPU", arch="none")
