"""The on-disk format of one drive of the SSD tier.

A drive directory holds ``hicache-disk/``::

    index.hcx   superblock (4 KiB) + one 64-byte entry per slot, memory-mapped by every rank
    data.hcd    nslots x slot_bytes, preallocated; slot i at offset i x slot_bytes
    owner.lock  flock: shared by every process that has the drive open, exclusive for recovery

Slots are ``slot_bytes`` = the page part rounded up to 4 KiB, so every slot starts 4 KiB-aligned
and a page part of the host pool (itself 4 KiB- or hugepage-aligned) moves with one ``O_DIRECT``
call, no staging copy.

The superblock names what the slots were written for (:func:`identity_of`): the format version,
the key scheme and every key field that is the same for the whole pod (namespace, backend tag,
model, format tag, layout, dtype, page tokens, TP size), plus the slot size and count. A drive
whose superblock differs is another deployment's, model's, layout's or key scheme's (or another
geometry): its slots are never read, the drive is re-initialised (and the reason logged). Each
entry also carries the SHA-256 of its full key, so a page is only ever served for its own key.

Entry (little endian, 64 bytes)::

    0   32s  SHA-256 of the key
    32  u32  state: 0 free, 1 writing, 2 committed
    36  u32  generation: bumped whenever the slot is claimed or freed
    40  u64  value size in bytes
    48  u64  last use (ns since the epoch): LRU within the set
    56  u32  pid of the writer while writing (a dead writer's slot is free again)
    60  u32  reserved
"""

from __future__ import annotations

import hashlib
import struct

MAGIC = b"HCDISK01"
FORMAT_VERSION = 1
ALIGN = 4096
SUPERBLOCK_BYTES = 4096
ENTRY_BYTES = 64
#: Ways per set: a key may live in any of WAYS slots of its set; LRU within the set. 16 ways keep
#: hit ratios within a point of a global LRU (a set-associative cache's usual figure) while a
#: lookup reads one 1 KiB run of the index.
WAYS = 16
DIR_NAME = "hicache-disk"
INDEX_FILE = "index.hcx"
DATA_FILE = "data.hcd"
LOCK_FILE = "owner.lock"

FREE, WRITING, COMMITTED = 0, 1, 2

ENTRY = struct.Struct("<32sIIQQII")
# magic, version, ways, slot_bytes, nslots, identity digest, identity length
SUPER = struct.Struct("<8sIIQQ32sI")
MAX_IDENTITY_BYTES = SUPERBLOCK_BYTES - SUPER.size
assert ENTRY.size == ENTRY_BYTES


def align_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def slot_bytes_for(value_bytes: int) -> int:
    """A slot holds the largest page part, rounded up to 4 KiB."""
    if value_bytes < 1:
        raise ValueError(f"value_bytes={value_bytes!r} must be >= 1")
    return align_up(value_bytes)


def slots_for(capacity_bytes: int, slot_bytes: int) -> int:
    """Slots a drive of ``capacity_bytes`` holds: whole sets of :data:`WAYS` slots (fewer ways
    only below one set). 0 when not even one slot fits."""
    n = capacity_bytes // slot_bytes
    return n - n % WAYS if n >= WAYS else n


def index_bytes_for(nslots: int) -> int:
    """Size of ``index.hcx``: the superblock plus one entry per slot, in whole 4 KiB pages."""
    return align_up(SUPERBLOCK_BYTES + nslots * ENTRY_BYTES)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def identity_of(scheme: str, fields: str, slot_bytes: int, nslots: int) -> str:
    """What a drive's slots were written for; equal identities read each other's slots."""
    return (f"format={FORMAT_VERSION};scheme={scheme};fields={fields};"
            f"slot_bytes={slot_bytes};slots={nslots}")


def pack_superblock(identity: str, slot_bytes: int, nslots: int, ways: int) -> bytes:
    raw = identity.encode()
    if len(raw) > MAX_IDENTITY_BYTES:
        raw = raw[:MAX_IDENTITY_BYTES]  # the digest below still covers the whole identity
    head = SUPER.pack(MAGIC, FORMAT_VERSION, ways, slot_bytes, nslots,
                      hashlib.sha256(identity.encode()).digest(), len(raw))
    return (head + raw).ljust(SUPERBLOCK_BYTES, b"\0")


def unpack_identity(block: bytes) -> tuple[bytes, str] | None:
    """(identity digest, identity text) of a superblock, or None when it is not ours."""
    if len(block) < SUPER.size:
        return None
    magic, version, _ways, _slot, _n, digest, length = SUPER.unpack_from(block)
    if magic != MAGIC or version != FORMAT_VERSION or length > MAX_IDENTITY_BYTES:
        return None
    return digest, block[SUPER.size : SUPER.size + length].decode(errors="replace")
