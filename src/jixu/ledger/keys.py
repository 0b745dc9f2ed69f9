"""Checkpoint keys: the secret that seals checkpoints (HMAC-SHA256), kept outside the store.

A checkpoint lets a stream open without replaying its history, so whoever can
write a checkpoint can choose the state a process acts on. The store alone
cannot vouch for one (anybody who can write the database can recompute a
public digest), so checkpoints are sealed with a key held in a file of its own
(decision 0025):

* **Where**: the path given, else ``$JIXU_KEY_FILE``, else
  ``$XDG_CONFIG_HOME/jixu/checkpoint-keys`` (``~/.config/jixu/checkpoint-keys``).
  Every process that opens the same store should read the same file (for
  PostgreSQL with workers on many machines: distribute it like any secret).
* **Made on first use**: the first seal creates the file (mode 0600, its
  directory 0700 when jixu makes it) with one random 256-bit key, atomically
  (two processes starting at once end up with the same file).
* **Format**: one key per line, ``jixu-key-v1 <key id> <64 hex>``; ``#``
  lines are comments. The first key seals; every key listed verifies. A key id
  is derived from its secret (it is not secret).
* **Rotation**: :func:`rotate_keys` puts a new key first and keeps the others,
  so existing checkpoints stay usable until rewritten; :func:`retire_keys`
  keeps only the current key (checkpoints sealed by the others are then not
  trusted: they are replayed past and rewritten).
* **Missing or wrong**: a file that is missing, malformed, not a regular file,
  readable or writable by others, owned by another user (but root), or in a
  directory another user owns or may write to (without the sticky bit) yields no usable key (:attr:`Keyring.problem`
  says why). Nothing is then trusted: every checkpoint is ignored and the
  events are replayed; nothing is sealed (:class:`~jixu.errors.KeyUnavailable`).

Whoever holds both the key and the database can still forge anything: the
key separates the people who may write the database from those who may vouch
for a state.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import os
import secrets
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from jixu.errors import KeyUnavailable

KEY_FILE_ENV = "JIXU_KEY_FILE"
"""The environment variable naming the key file."""
KEY_FILE_NAME = "checkpoint-keys"
LINE_TAG = "jixu-key-v1"
SEAL_PREFIX = "hmac-sha256:"
_ID_TAG = b"jixu.key.id.v1\x00"
_HEADER = ("# jixu checkpoint keys (decision 0025): the first key seals, every key listed verifies.\n"
           "# Keep this file secret (mode 0600); give every process that opens the same store the same file.\n")

SealStatus = Literal["sealed", "forged", "unknown_key", "unsealed"]
"""What a seal says: made by a key held here; not made by the key it names (forged or damaged); made by a key
not held here; not a seal at all (an unkeyed digest of an older version, or garbage)."""


def default_key_path() -> Path | None:
    """``$JIXU_KEY_FILE``, else ``$XDG_CONFIG_HOME/jixu/checkpoint-keys``; ``None`` without a home directory."""
    environ = os.environ
    return _key_path_for(environ.get(KEY_FILE_ENV), environ.get("XDG_CONFIG_HOME"), environ.get("HOME"))


@functools.lru_cache(maxsize=16)
def _key_path_for(given: str | None, config: str | None, home: str | None) -> Path | None:
    """:func:`default_key_path` for these environment values: every opening and seal asks for it, and
    ``Path.home()`` costs more than the rest of a key lookup (remembered per value, so a changed
    environment still counts)."""
    if given:
        return Path(given)
    if config:
        return Path(config) / "jixu" / KEY_FILE_NAME
    found = os.path.expanduser("~") if home is None else home  # what Path.home() reads
    if found.startswith("~"):
        return None  # no $HOME and no password entry: Path.home() would raise
    return Path(found) / ".config" / "jixu" / KEY_FILE_NAME


def key_id(secret: bytes) -> str:
    """The public name of a key: 16 hex characters derived from it."""
    return hashlib.sha256(_ID_TAG + secret).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Keyring:
    """The keys of one key file: the first seals, all of them verify. Empty (with a ``problem``) when unusable."""

    path: Path | None
    keys: tuple[tuple[str, bytes], ...] = ()
    problem: str | None = None
    """Why no key is usable (``None`` when :attr:`keys` holds at least one)."""

    @property
    def current(self) -> str | None:
        """The id of the key that seals, if any."""
        return self.keys[0][0] if self.keys else None

    def seal(self, tag: bytes, parts: Iterable[bytes]) -> str:
        """``hmac-sha256:<key id>:<hex>`` of ``tag`` followed by ``parts``, with the current key.

        Raises :class:`~jixu.errors.KeyUnavailable` when there is no key to seal with.
        """
        if not self.keys:
            raise KeyUnavailable(f"no checkpoint key to seal with: {self.problem}", path=str(self.path))
        kid, secret = self.keys[0]
        return f"{SEAL_PREFIX}{kid}:{_mac(secret, tag, parts)}"

    def check(self, seal: str, tag: bytes, parts: Iterable[bytes]) -> SealStatus:
        """Whether ``seal`` is this message's seal by a key held here (see :data:`SealStatus`)."""
        kid = sealing_key(seal)
        if kid is None:
            return "unsealed"
        mac = seal[len(SEAL_PREFIX) + len(kid) + 1:]
        secret = next((s for k, s in self.keys if k == kid), None)
        if secret is None:
            return "unknown_key"
        if not mac.isascii():  # compare_digest refuses non-ASCII text (a row edited so): no seal of ours
            return "forged"
        return "sealed" if hmac.compare_digest(mac, _mac(secret, tag, parts)) else "forged"


def sealing_key(seal: object) -> str | None:
    """The id of the key a seal (``hmac-sha256:<key id>:<hex>``) names, or None when it is no seal at all (a row
    edited to hold bytes, an unkeyed digest of an older version). Naming a key proves nothing: :meth:`Keyring.check`
    does."""
    if not isinstance(seal, str) or not seal.startswith(SEAL_PREFIX):
        return None
    return seal[len(SEAL_PREFIX):].partition(":")[0]


def _mac(secret: bytes, tag: bytes, parts: Iterable[bytes]) -> str:
    mac = hmac.new(secret, tag, hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.hexdigest()


_CACHE: dict[Path | None, tuple[tuple[int, ...] | None, Keyring]] = {}
_CACHE_LOCK = threading.Lock()


def keyring(path: str | os.PathLike[str] | None = None) -> Keyring:
    """The keys in ``path`` (default: :func:`default_key_path`), read again whenever the file changes.

    Never creates the file: a missing one is an empty keyring (nothing is trusted, nothing sealed).
    """
    where = Path(path) if path is not None else default_key_path()
    if where is None:
        return Keyring(None, problem="no key file: set $JIXU_KEY_FILE (there is no home directory)")
    try:
        info = os.stat(where)
    except FileNotFoundError:
        return Keyring(where, problem=f"the key file {where} does not exist (it is made by the first seal)")
    except OSError as error:
        return Keyring(where, problem=f"the key file {where} cannot be read: {error.strerror}")
    try:
        folder = os.stat(where.parent)
    except OSError:
        folder = info  # not readable: _load says so
    # The directory's owner and mode count too: a folder opened to others makes the key unusable (_load).
    version = (info.st_ino, info.st_mtime_ns, info.st_size, info.st_mode, info.st_uid, folder.st_uid,
               folder.st_mode)
    with _CACHE_LOCK:
        cached = _CACHE.get(where)
        if cached is not None and cached[0] == version:
            return cached[1]
    loaded = _load(where, info)
    with _CACHE_LOCK:
        _CACHE[where] = (version, loaded)
    return loaded


def _load(path: Path, info: os.stat_result) -> Keyring:
    if not stat.S_ISREG(info.st_mode):
        return Keyring(path, problem=f"the key file {path} is not a regular file")
    if info.st_mode & 0o077:
        return Keyring(path, problem=f"the key file {path} is open to others (mode {stat.S_IMODE(info.st_mode):04o}); "
                                     f"chmod 600 {path}")
    replaceable = _replaceable_by_others(path, info)
    if replaceable is not None:
        return Keyring(path, problem=replaceable)
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as error:
        return Keyring(path, problem=f"the key file {path} cannot be read: {error}")
    keys: list[tuple[str, bytes]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        try:
            secret = bytes.fromhex(fields[2]) if len(fields) == 3 and fields[0] == LINE_TAG else b""
        except ValueError:
            secret = b""
        if len(secret) != 32 or key_id(secret) != fields[1]:
            return Keyring(path, problem=f"line {number} of the key file {path} is not a jixu key "
                                         f"({LINE_TAG} <key id> <64 hex characters>)")
        keys.append((fields[1], secret))
    if not keys:
        return Keyring(path, problem=f"the key file {path} holds no key")
    return Keyring(path, tuple(keys))


def _replaceable_by_others(path: Path, info: os.stat_result) -> str | None:
    """Why somebody but this process's user (or root) could put another key in ``path``'s place, or None: the
    file owned by another user, or its directory owned by another user or writable by others without the sticky
    bit (as ``sshd``'s StrictModes asks of its keys)."""
    mine = (os.geteuid(), 0)
    if info.st_uid not in mine:
        return f"the key file {path} belongs to user {info.st_uid}, not this process's ({os.geteuid()}): that user " \
               "could replace it"
    try:
        folder = os.stat(path.parent)
    except OSError as error:
        return f"the key file's directory {path.parent} cannot be read: {error.strerror}"
    if folder.st_uid not in mine:
        return f"the key file's directory {path.parent} belongs to user {folder.st_uid}: that user could replace " \
               "the key"
    if folder.st_mode & 0o022 and not folder.st_mode & stat.S_ISVTX:
        return (f"the key file's directory {path.parent} is writable by others (mode "
                f"{stat.S_IMODE(folder.st_mode):04o}): anybody could replace the key; chmod go-w {path.parent}")
    return None


def _text(keys: Iterable[tuple[str, bytes]]) -> str:
    return _HEADER + "".join(f"{LINE_TAG} {kid} {secret.hex()}\n" for kid, secret in keys)


def _new_key() -> tuple[str, bytes]:
    secret = secrets.token_bytes(32)
    return key_id(secret), secret


def _write_new(path: Path, text: str, *, replace: bool) -> None:
    """Write ``text`` to ``path`` (mode 0600) atomically: fully or not at all; without ``replace``, only if
    ``path`` does not exist yet (another process that made it first wins)."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(temporary, path)
        else:
            with contextlib.suppress(FileExistsError):  # another process made it first: its key is the key
                os.link(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def sealing_keyring(path: str | os.PathLike[str] | None = None) -> Keyring:
    """:func:`keyring`, making the key file with a fresh key first when it does not exist.

    Raises :class:`~jixu.errors.KeyUnavailable` when the file cannot be made or holds no usable key.
    """
    found = keyring(path)
    if found.keys:
        return found
    where = found.path
    if where is not None and where.exists():
        found = keyring(where)  # another process may have made it since the first look: read it as it is now
        if found.keys:
            return found
    if where is None or where.exists():
        raise KeyUnavailable(f"no checkpoint key to seal with: {found.problem}", path=str(where))
    try:
        _write_new(where, _text([_new_key()]), replace=False)
    except OSError as error:
        raise KeyUnavailable(f"cannot make the checkpoint key file {where}: {error.strerror}; set "
                             f"${KEY_FILE_ENV} to a writable place", path=str(where)) from error
    made = keyring(where)
    if not made.keys:
        raise KeyUnavailable(f"no checkpoint key to seal with: {made.problem}", path=str(where))
    return made


def rotate_keys(path: str | os.PathLike[str] | None = None) -> Keyring:
    """Put a new key first (it seals from now on); the earlier keys stay, so their checkpoints still verify."""
    found = keyring(path)
    if found.path is None:
        raise KeyUnavailable(f"no key file to rotate: {found.problem}")
    if not found.keys and found.path.exists():
        raise KeyUnavailable(f"cannot rotate: {found.problem}", path=str(found.path))
    _write_new(found.path, _text([_new_key(), *found.keys]), replace=True)
    return keyring(found.path)


def retire_keys(path: str | os.PathLike[str] | None = None, *, keep: str | None = None) -> Keyring:
    """Keep only the current key: checkpoints sealed by the others are no longer trusted (they are rebuilt).

    ``keep``: the key id the caller expects to be current (it sealed things again with it); another current key
    (a rotation meanwhile) is :class:`~jixu.errors.KeyUnavailable`, nothing retired."""
    found = keyring(path)
    if found.path is None or not found.keys:
        raise KeyUnavailable(f"no key to keep: {found.problem}", path=str(found.path))
    if keep is not None and found.current != keep:
        raise KeyUnavailable(f"the current key is now {found.current}, not {keep} (rotated meanwhile): nothing "
                             "retired; run it again", path=str(found.path))
    _write_new(found.path, _text(found.keys[:1]), replace=True)
    return keyring(found.path)


__all__ = ["KEY_FILE_ENV", "Keyring", "SealStatus", "default_key_path", "key_id", "keyring", "retire_keys",
           "rotate_keys", "sealing_key", "sealing_keyring"]
