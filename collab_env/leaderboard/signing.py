"""Signed verdicts: a fresh clone builds the seeded board without re-playing what its maintainers
already verified, and a submitter cannot bring a verdict of their own.

Re-playing every entry costs about a minute on 2 cores (the code tracks re-run every test in the
sandbox). ``build`` keeps its own verdicts outside the board folder, in the user cache
(:func:`~collab_env.leaderboard.board.stamps_file`: whoever builds a board verifies its folder
once, and nothing a submitter writes is taken as a verdict). This module adds verdicts that travel with the
repository, in :data:`SIGNED_FILE` beside the entries, each **signed** with an Ed25519 key whose
public half is pinned in this module (:data:`TRUSTED_KEYS`), not in the data:

* A signed verdict covers one entry folder *as it was verified*: its ``key`` is
  :func:`~collab_env.leaderboard.board.verification_key`, the SHA-256 of every file of the folder,
  the track's content hash and collab_env's version. ``build`` recomputes that key from the files
  it reads, so an edited, added or replaced file (or another track version) never matches a
  signed verdict: that entry is re-played. A verdict never hides a tampered file.
* The signature covers the folder's path, the key, the verdict and its problems. A verdict whose
  signature does not verify against a pinned key (an edited ``ok``, a verdict signed with any
  other key, a file written by hand) is ignored, and the entry is re-played.
* The private key stays with the maintainers, outside the repository
  (``collab-env leaderboard sign DIRECTORY --key FILE``). A submitter who edits
  :data:`SIGNED_FILE` only makes their entry re-play; changing :data:`TRUSTED_KEYS` is a change to
  the code, reviewed as one.

``cryptography`` (the ``leaderboard`` extra, in ``make test``'s environment) does the Ed25519
work; a board built without it re-plays every entry, as it would without the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collab_env.errors import ConfigError, MissingDependencyError

__all__ = ["SIGNED_FILE", "TRUSTED_KEYS", "sign_verdicts", "signed_verdicts", "generate_key", "public_key_hex"]

#: The signed verdicts of a board, in the board's folder (committed with the entries).
SIGNED_FILE = "verdicts.signed.json"
#: Key id -> raw Ed25519 public key (hex) whose signatures ``build`` accepts.
TRUSTED_KEYS: dict[str, str] = {
    "collab-env-board-2026-12": "56f44bfb5daa6093114c120977ab49e35be4b7262c974e8cb942f1556a35a48d",
    # Pinned in issue 26's change: the first key's private half did not reach the machine that
    # added the hidden-facts-copy entries, so the board was re-verified and re-signed with this one.
    "collab-env-board-2026-12b": "79ccdbedbc3ba122fbf1337534fb359b8009dfdacc3d8d463a4866a3bc56622b",
    # Pinned in issue 42's change: neither private half above reached the machine that added the
    # entries of the current tracks (v4 hidden-facts, the -mini CollabLLM twins, letter-requests@v2),
    # so the board was re-verified and re-signed with this one.
    "collab-env-board-2026-12c": "3f50c981a06019f7b285905ee26d041996cb31ed6c82a1c5603ca8adba629889",
    # Pinned on 2026-12-07: the machine that held 12c's private half was replaced (the key lived
    # outside the repository, as it must), so the board was re-verified and re-signed with this one.
    "collab-env-board-2026-12d": "2e595db83d2389c6a5ce5da43c263212f088f6aab4f64d6acd73a7a456d56e5b",
}


def _crypto():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise MissingDependencyError(
            "signed verdicts need the package 'cryptography': pip install cryptography") from exc
    return ed25519


def _payload(rel: str, stamp: Mapping[str, Any]) -> bytes:
    body = {"path": rel, "key": stamp["key"], "ok": bool(stamp["ok"]), "episodes": int(stamp["episodes"]),
            "problems": [str(p) for p in stamp["problems"]]}
    if "regenerated" in stamp:  # signed since regeneration counts are kept (older verdicts lack it)
        body["regenerated"] = None if stamp["regenerated"] is None else int(stamp["regenerated"])
    return json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":")).encode()


#: The fields of a verdict (``regenerated``, the episodes whose calls were regenerated, is
#: absent from verdicts signed before it was kept).
_FIELDS = ("key", "ok", "episodes", "problems", "regenerated")


def generate_key(path: str | os.PathLike[str]) -> str:
    """Write a new Ed25519 private key (raw, hex) to ``path`` (mode 0600, never overwritten) and
    return its public key (hex), to pin in :data:`TRUSTED_KEYS`."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    path = Path(path)
    if path.exists():
        raise ConfigError(f"{path} exists; a signing key is never overwritten.")
    key = ed25519.Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(raw.hex() + "\n")
    return public_key_hex(path)


def _private_key(path: str | os.PathLike[str]):
    ed25519 = _crypto()
    try:
        raw = bytes.fromhex(Path(path).read_text().strip())
        return ed25519.Ed25519PrivateKey.from_private_bytes(raw)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a signing key (one line: the raw Ed25519 private key in hex): {exc}") from exc


def public_key_hex(path: str | os.PathLike[str]) -> str:
    """The public key (hex) of the private key in ``path``."""
    from cryptography.hazmat.primitives import serialization

    pub = _private_key(path).public_key()
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def sign_verdicts(stamps: Mapping[str, Mapping[str, Any]], key_path: str | os.PathLike[str],
                  key_id: str | None = None) -> dict[str, Any]:
    """The content of :data:`SIGNED_FILE` for ``stamps`` (``{folder: {"key", "ok", "episodes",
    "problems", "regenerated"}}``, what ``build`` keeps after re-playing them).

    Raises:
        ConfigError: The key is not one of :data:`TRUSTED_KEYS` (its verdicts would be ignored),
            or unreadable.
    """
    pub = public_key_hex(key_path)
    ids = [k for k, v in TRUSTED_KEYS.items() if v == pub]
    if key_id is None:
        if not ids:
            raise ConfigError(f"the key in {key_path} (public key {pub}) is not among TRUSTED_KEYS of "
                              "collab_env.leaderboard.signing: pin it there first, or sign with a pinned key.")
        key_id = ids[0]
    elif TRUSTED_KEYS.get(key_id) != pub:
        raise ConfigError(f"the key in {key_path} is not the pinned key {key_id!r}.")
    private = _private_key(key_path)
    verdicts = {}
    for rel, stamp in sorted(stamps.items()):
        verdicts[rel] = {"key": stamp["key"], "ok": bool(stamp["ok"]), "episodes": int(stamp["episodes"]),
                         "problems": [str(p) for p in stamp["problems"]],
                         **({"regenerated": stamp["regenerated"]} if "regenerated" in stamp else {}),
                         "signature": private.sign(_payload(rel, stamp)).hex()}
    return {"format": 1, "key_id": key_id, "verdicts": verdicts}


def signed_verdicts(directory: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The verdicts of ``directory/SIGNED_FILE`` whose signatures verify against a pinned key:
    ``({folder: stamp}, notes)``; ``notes`` say what was ignored and why (a missing file is no
    note; a file that cannot be read, an unknown key, a bad signature are)."""
    path = Path(directory) / SIGNED_FILE
    if not path.is_file() or path.is_symlink():
        return {}, ([f"{SIGNED_FILE} is a link: ignored"] if path.is_symlink() else [])
    from collab_env._json import loads

    try:
        data = loads(path.read_bytes(), str(path))
        key_id = str(data["key_id"])
        verdicts = dict(data["verdicts"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {}, [f"{SIGNED_FILE} could not be read ({type(exc).__name__}): every entry is re-played"]
    pub = TRUSTED_KEYS.get(key_id)
    if pub is None:
        return {}, [f"{SIGNED_FILE} is signed with {key_id!r}, not a pinned key: every entry is re-played"]
    try:
        ed25519 = _crypto()
    except MissingDependencyError as exc:
        return {}, [f"{SIGNED_FILE} not read: {exc}"]
    from cryptography.exceptions import InvalidSignature

    public = ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub))
    good: dict[str, dict[str, Any]] = {}
    bad = []
    for rel, stamp in verdicts.items():
        try:
            public.verify(bytes.fromhex(stamp["signature"]), _payload(str(rel), stamp))
        except (InvalidSignature, KeyError, TypeError, ValueError):
            bad.append(str(rel))
            continue
        good[str(rel)] = {k: stamp[k] for k in _FIELDS if k in stamp}
    notes = [f"{len(bad)} signed verdict(s) with a bad signature ignored: {', '.join(sorted(bad)[:5])}"] if bad else []
    return good, notes
