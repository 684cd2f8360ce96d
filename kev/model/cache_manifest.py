"""A converted model folder's manifest: each file's size and content hash, written last, checked at every load.

A cache folder is trusted only if its manifest says so: a bit flip inside tensor data, a truncated file or a damaged
config.json is found before the model loads (a damaged folder once served "" with `ok`). The hash is SHA-256 over
64 MiB pieces, the pieces' digests hashed again (a tree of one level): hashlib drops the GIL on each piece, so the
pieces of all files spread over every core. KEV_CACHE_VERIFY picks how much a load checks: `full` (default),
`sizes` (sizes only: catches a truncated or missing file, not a flipped bit; for operators who accept the risk), or
`off`.

Cost, the default model (SmolLM2-135M converted: 540 MB in 4 files), Xeon (family 6), 2 cores shared with other
work (load average 7.4): `full` 1.04 / 1.29 / 1.27 s (three runs, page cache warm), `sizes` under 1 ms; loading that
model takes 16 s in the same conditions (`load_model_and_tokenizer`, the check included). Reproduce:
`find_damage(folder, "full")` timed on the cache folder (kev/model/cache_manifest.py).
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kev.errors import ConfigError

MANIFEST = "kev-manifest.json"
PIECE = 64 << 20
HASH = "sha256-tree-64MiB"
MODES = ("full", "sizes", "off")


def verify_mode() -> str:
    mode = os.environ.get("KEV_CACHE_VERIFY", "full").strip().lower() or "full"
    if mode not in MODES:
        raise ConfigError(f"KEV_CACHE_VERIFY={mode!r}: use one of {', '.join(MODES)}")
    return mode


def write_manifest(folder: Path, files: list[str] | None = None, manifest: str = MANIFEST) -> None:
    """Hash every file in folder (or just `files`) and write the manifest beside them: call it last, when the files
    are final. `manifest` names it (one cache file among others, e.g. an int8 cache, has its own: file_manifest)."""
    if files is None:
        files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != manifest)
    sizes = {name: (folder / name).stat().st_size for name in files}
    hashes = _hash_files(folder, sizes)
    body = {"hash": HASH, "files": {name: {"size": sizes[name], "hash": hashes[name]} for name in files}}
    partial = folder / f".{manifest}.partial"
    partial.write_text(json.dumps(body, indent=1) + "\n")
    partial.replace(folder / manifest)


def file_manifest(path: Path) -> str:
    """The name of the manifest of one cache file that shares its folder with others (beside it, in that folder)."""
    return f"{path.name}.{MANIFEST}"


def has_manifest(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def find_damage(folder: Path, mode: str | None = None, manifest: str = MANIFEST) -> str | None:
    """None if the folder matches its manifest, else why not (one phrase naming the file)."""
    mode = mode or verify_mode()
    if mode == "off":
        return None
    try:
        body = json.loads((folder / manifest).read_text())
        expected = {name: (int(entry["size"]), str(entry["hash"])) for name, entry in body["files"].items()}
    except FileNotFoundError:
        return f"it has no {manifest} (an interrupted conversion, or an older Kev's)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"its {manifest} is unreadable ({err})"
    sizes: dict[str, int] = {}
    for name, (size, _) in expected.items():
        try:
            sizes[name] = (folder / name).stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if sizes[name] != size:
            return f"{name} is {sizes[name]} bytes, the manifest says {size}"
    if mode == "full":
        for name, digest in _hash_files(folder, sizes).items():
            if digest != expected[name][1]:
                return f"{name}'s content does not match its hash"
    return None


def _hash_files(folder: Path, sizes: dict[str, int]) -> dict[str, str]:
    """Each file's tree hash; every piece of every file is one task, so one big file still uses all cores."""
    pieces = [(name, start) for name, size in sizes.items() for start in range(0, max(size, 1), PIECE)]
    with ThreadPoolExecutor(max(1, min(len(pieces), os.cpu_count() or 1))) as pool:
        digests = list(pool.map(lambda piece: _hash_piece(folder / piece[0], piece[1]), pieces))
    trees = {name: hashlib.sha256() for name in sizes}
    for (name, _), digest in zip(pieces, digests):
        trees[name].update(digest)
    return {name: tree.hexdigest() for name, tree in trees.items()}


def _hash_piece(path: Path, start: int) -> bytes:
    with path.open("rb") as f:
        f.seek(start)
        return hashlib.sha256(f.read(PIECE)).digest()
