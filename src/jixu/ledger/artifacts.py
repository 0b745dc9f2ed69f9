"""Content-addressed artifacts: large values stored once, as a stream of their own.

An event's payload is limited (1 MiB by default), and a long thread's state
should not carry every large tool output it ever saw. A value that is too big
to inline is stored as an **artifact**: its text, split into chunks, appended
in one atomic batch to the stream ``artifact/<sha256 of the text>``. Events
then carry only a reference ``{"sha256", "size"}``.

Because the stream name is the content's hash, storing the same text twice
writes it once, and a reader checks the text it reassembles against the name
(and the stream's own hash chain covers the chunks). Artifacts use the
ordinary append, so every store holds them, they are as durable as events,
and a reference is only ever written after its artifact's append returned.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any

from jixu.errors import ArtifactCorrupt, ArtifactNotFound, ConcurrencyError, InvalidInput
from jixu.ledger.event import HASH_PATTERN, NewEvent
from jixu.ledger.store import Store

ARTIFACT_PREFIX = "artifact/"
CHUNK_CHARS = 128 * 1024
"""Characters per ``artifact.chunk`` event: even if every character needed a six-byte escape, a chunk stays
under the ledger's 1 MiB payload limit."""
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
"""The largest text stored as one artifact (it is appended, and read back, in one piece)."""


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """What an event stores in place of a large value."""

    sha256: str
    size: int
    """UTF-8 bytes of the text."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form events carry."""
        return {"sha256": self.sha256, "size": self.size}

    @classmethod
    def from_dict(cls, value: object) -> ArtifactRef:
        """Parse a reference written by :meth:`to_dict` (raises :class:`InvalidInput`)."""
        if not isinstance(value, dict) or not isinstance(value.get("sha256"), str) \
                or not HASH_PATTERN.match(value["sha256"]) or type(value.get("size")) is not int:
            raise InvalidInput(f"{value!r} is not an artifact reference ({{sha256, size}})", field="artifact")
        return cls(value["sha256"], value["size"])


def stream_of_artifact(sha256: str) -> str:
    """The stream that holds the artifact with this hash."""
    return ARTIFACT_PREFIX + sha256


def put_text(store: Store, text: str, *, meta: dict[str, Any] | None = None) -> ArtifactRef:
    """Store ``text`` once (a no-op if it is stored already) and return its reference.

    Durable when this returns: the chunks were appended in one atomic batch.
    """
    if not isinstance(text, str):
        raise InvalidInput("an artifact's content must be a str", field="text")
    data = text.encode("utf-8")
    if len(data) > MAX_ARTIFACT_BYTES:
        raise InvalidInput(f"an artifact of {len(data)} bytes exceeds the limit of {MAX_ARTIFACT_BYTES}",
                           field="text", size=len(data), limit=MAX_ARTIFACT_BYTES)
    ref = ArtifactRef(hashlib.sha256(data).hexdigest(), len(data))
    stream = stream_of_artifact(ref.sha256)
    if store.stream_info(stream) is not None:
        return ref
    parts = [text[start:start + CHUNK_CHARS] for start in range(0, len(text), CHUNK_CHARS)] or [""]
    events = [NewEvent("artifact.chunk", {"index": index, "of": len(parts), "text": part, **(
        {"size": ref.size} if index == 0 else {})}, dict(meta or {})) for index, part in enumerate(parts)]
    with contextlib.suppress(ConcurrencyError):
        # Another writer stored the same content first: its stream holds exactly this text.
        store.append(stream, events, 0)
    return ref


def get_text(store: Store, ref: ArtifactRef) -> str:
    """The text of a stored artifact, checked against its hash (raises if missing or altered)."""
    events = store.read(stream_of_artifact(ref.sha256))
    if not events:
        raise ArtifactNotFound(f"no artifact {ref.sha256} in {store.url}", sha256=ref.sha256)
    text = "".join(str(event.data.get("text", "")) for event in events if event.type == "artifact.chunk")
    data = text.encode("utf-8")
    if hashlib.sha256(data).hexdigest() != ref.sha256 or len(data) != ref.size:
        raise ArtifactCorrupt(f"artifact {ref.sha256} in {store.url} does not match its hash; inspect it with "
                              f"`jixu verify STORE --stream {stream_of_artifact(ref.sha256)}`", sha256=ref.sha256)
    return text


__all__ = [
    "ARTIFACT_PREFIX",
    "ArtifactRef",
    "get_text",
    "put_text",
    "stream_of_artifact",
]
