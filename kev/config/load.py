"""Load kev.yaml (or a dict) into a frozen KevConfig; every problem names its key."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kev.config.schema import KevConfig
from kev.errors import ConfigError, describe_os_error

ConfigSource = str | Path | dict[str, Any] | KevConfig | None


def load_config(source: ConfigSource = None, overrides: dict[str, Any] | None = None) -> KevConfig:
    """Accepts a path to YAML, a dict (with or without the top-level `kev:` key), or None."""
    if isinstance(source, KevConfig) and not overrides:
        return source
    raw = _read(source)
    if overrides:
        raw = _merge(raw, overrides)
    try:
        return KevConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def explicit_values(source: ConfigSource) -> dict[str, Any]:
    """The fields the config file itself sets, as dotted keys ("core.max_context": 2048); not the defaults."""
    if source is None or isinstance(source, KevConfig):
        return {}
    return {f"{section}.{key}": value for section, fields in _read(source).items() if isinstance(fields, dict)
            for key, value in fields.items()}


def _read(source: ConfigSource) -> dict[str, Any]:
    if source is None:
        return {}
    if isinstance(source, KevConfig):
        return source.model_dump()
    if isinstance(source, dict):
        data: Any = source
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        except OSError as err:  # unreadable (permission denied, a folder, too many open files): one line
            raise ConfigError(f"config file {describe_os_error(err, path)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
    if set(data) == {"kev"}:
        data = data["kev"] or {}
    elif "kev" in data:
        raise ConfigError("config: put every section under the top-level key 'kev' (found 'kev' beside other keys)")
    return dict(data)


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(err: ValidationError) -> str:
    lines = []
    for problem in err.errors():
        key = "kev." + ".".join(str(part) for part in problem["loc"]) if problem["loc"] else "kev"
        if problem["type"] == "extra_forbidden":
            lines.append(f"unknown config key '{key}'")
        else:
            message = problem["msg"].removeprefix("Value error, ")
            lines.append(f"{key}: {message} (got {problem.get('input')!r})")
    return "invalid config: " + "; ".join(lines)
