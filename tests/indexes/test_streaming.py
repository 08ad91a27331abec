"""The streamed index build equals the rebuild from the installed file.

A model of what the transfer does to the demander's temp file: a real partition file
at counter C (checkpoint's own store and page code, overflow chains included), then
random updates after C (puts that split pages and move keys, removals, big values on
chains), a second checkpoint; the demander first receives a random mix of page
versions (C or after C) in random order, then pre-image pages restore C for every page
that differs, plus random spurious overwrites - each write told to the builder as the
transfer tells it. The streamed keys, loaded by the rebuild's load stage, must give
exactly the LMDB entries and counts a rebuild from the final file gives.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile

import lmdb
from hypothesis import HealthCheck, given, settings, strategies as st

from checkpoint import PartitionStore
from indexes import IndexDefinition, IndexStore, PartitionFileSource, StreamingUnavailable
from indexes.verify import stored

PS = 1024
P = 3
DEFS = [IndexDefinition("city", "city"), IndexDefinition("n", "n", type="int"),
        IndexDefinition("u", "u", unique=True)]


def _value(rng: random.Random, big: bool) -> bytes:
    doc = '{"city": "%s", "n": %d, "u": %d, "pad": "%s"}' % (
        rng.choice(["Oslo", "Lima", "Pune", "Kiev"]), rng.randrange(50), rng.randrange(40),
        "x" * (rng.randrange(1500, 4000) if big else rng.randrange(0, 120)))
    if rng.random() < 0.05:
        return b"not json"
    return doc.encode()


def _versions(root: str, seed: int, n: int, m: int) -> tuple[bytes, bytes]:
    """(file at C, file after m more updates) of one partition."""
    rng = random.Random(seed)
    store = PartitionStore.open(os.path.join(root, "store"), page_size=PS, checkpoint_interval=None)
    try:
        keys = [b"key-%05d" % rng.randrange(10 * n + 1) for _ in range(n)]
        for k in keys:
            store.put(P, k, _value(rng, rng.random() < 0.15))
        store.checkpoint()
        with open(store.partition_path(P), "rb") as f:
            at_c = f.read()
        for _ in range(m):
            r = rng.random()
            if r < 0.25 and keys:
                store.remove(P, rng.choice(keys))
            else:
                k = rng.choice(keys) if r < 0.6 and keys else b"key-%05d" % rng.randrange(10 * n + 1)
                store.put(P, k, _value(rng, rng.random() < 0.2))
        store.checkpoint()
        with open(store.partition_path(P), "rb") as f:
            after = f.read()
    finally:
        store.close(checkpoint=False)
    return at_c, after


def _entries(ix: IndexStore) -> list[tuple[bytes, bytes]]:
    return list(stored(ix, P))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), m=st.integers(0, 200),
       span=st.sampled_from([1, 2, 4, 16]), steps=st.floats(0, 1), spurious=st.integers(0, 6))
def test_streamed_equals_rebuilt(seed: int, n: int, m: int, span: int, steps: float,
                                 spurious: int) -> None:
    root = tempfile.mkdtemp(prefix="ferry-stream-")
    try:
        at_c, after = _versions(root, seed, n, m)
        rng = random.Random(seed ^ 0x5EED)
        pcount = len(at_c) // PS
        tmp = os.path.join(root, "part.tmp")
        ix = IndexStore.open(os.path.join(root, "ix-stream"), DEFS)
        ref = IndexStore.open(os.path.join(root, "ix-ref"), DEFS)
        build = ix.streaming(P, tmp, PS, pcount, span)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o644)

        def write(page: int, src: bytes) -> None:
            data = src[page * PS:(page + 1) * PS]
            if len(data) < PS:
                data = bytes(PS)           # a page past the end of that version
            os.pwrite(fd, data, page * PS)
            build.pages_written(page, page + 1)
            if rng.random() < steps:       # the builder's thread runs now and then
                build.step()

        try:
            # 1. each page once, a random version, in random order (chunks, resends)
            order = list(range(pcount))
            rng.shuffle(order)
            for page in order:
                write(page, after if rng.random() < 0.5 else at_c)
            # 2. spurious overwrites with the other version, then the pre-images: C back
            for _ in range(spurious):
                if pcount:
                    write(rng.randrange(pcount), after)
            fix = [i for i in range(pcount)
                   if os.pread(fd, PS, i * PS) != at_c[i * PS:(i + 1) * PS]]
            rng.shuffle(fix)
            for page in fix:
                write(page, at_c)
            while rng.random() < 0.5 and build.step():
                pass
        finally:
            os.close(fd)
        with open(tmp, "rb") as f:
            assert f.read() == at_c
        final = os.path.join(root, "files")
        os.makedirs(final)
        shutil.copy(tmp, os.path.join(final, f"part-{P}.bin"))
        built = build.finish(os.path.join(final, f"part-{P}.bin"))
        got = ix.load_streamed(P, built)
        want = ref.rebuild(P, PartitionFileSource(final))
        assert _entries(ix) == _entries(ref)
        assert (got.entries, got.scanned, got.bad, got.duplicates, got.unique_conflicts) == \
            (want.entries, want.scanned, want.bad, want.duplicates, want.unique_conflicts)
        assert got.bad_samples == want.bad_samples
        assert ix.ready(P) and ref.ready(P)
        ix.close()
        ref.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _installed(tmp_path, seed: int, n: int) -> tuple[str, bytes]:
    """A partition file at C (no later versions) as the install would leave it."""
    at_c, _ = _versions(str(tmp_path), seed, n, 0)
    path = str(tmp_path / "part.bin")
    with open(path, "wb") as f:
        f.write(at_c)
    return path, at_c


def test_memory_limit_gives_up(tmp_path) -> None:
    path, at_c = _installed(tmp_path, 7, 200)
    ix = IndexStore.open(str(tmp_path / "ix"), DEFS)
    build = ix.streaming(P, path, PS, len(at_c) // PS, 4, memory_limit=1000)
    build.pages_written(0, len(at_c) // PS)
    while build.step():
        pass
    try:
        build.finish()
    except StreamingUnavailable as e:
        assert "memory limit" in str(e)
    else:
        raise AssertionError("a build past its memory limit was kept")
    ix.close()


def test_changed_definitions_refused(tmp_path) -> None:
    path, at_c = _installed(tmp_path, 8, 50)
    ix = IndexStore.open(str(tmp_path / "ix"), DEFS)
    build = ix.streaming(P, path, PS, len(at_c) // PS, 4)
    built = build.finish()
    ix.close()
    ix = IndexStore.open(str(tmp_path / "ix"), DEFS[:1])
    try:
        ix.load_streamed(P, built)
    except StreamingUnavailable:
        pass
    else:
        raise AssertionError("keys of other definitions were loaded")
    ix.close()


assert lmdb  # the real LMDB of both stores
