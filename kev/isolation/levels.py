"""Which isolation levels a config can run, and the config overrides that let an engine accept one."""
from __future__ import annotations

from typing import Any

from kev.config import KevConfig, load_config
from kev.config.schema import ISOLATION_ORDER
from kev.errors import ConfigError

LEVELS: tuple[str, ...] = ("strict", "shared", "loose")


def level_overrides(config: KevConfig, level: str, system: str) -> dict[str, Any]:
    """Overrides that make `level` acceptable: nothing if the config's cap already allows it.

    A looser cap needs read-only shared blocks; loose also needs a declared (public) system prompt.
    """
    iso = config.isolation
    if ISOLATION_ORDER[level] <= ISOLATION_ORDER[iso.level] and (level != "loose" or iso.system_prompt):
        return {}
    overrides: dict[str, Any] = {"level": level, "kv_cache": "shared_readonly"}
    if level == "loose":
        overrides["system_prompt"] = iso.system_prompt or system
    return {"isolation": overrides}


def config_for_level(config: KevConfig, level: str, system: str) -> KevConfig:
    """The config, loosened only as far as `level` needs. Raises ConfigError if the engine refuses it."""
    overrides = level_overrides(config, level, system)
    return load_config(config, overrides) if overrides else config


def accepted_levels(config: KevConfig, system: str) -> list[str]:
    """strict, plus every looser level whose config validates (the engine grows them over time)."""
    accepted = []
    for level in LEVELS:
        try:
            config_for_level(config, level, system)
        except ConfigError:
            continue
        accepted.append(level)
    return accepted
