"""What a store holds, for the tests of ``shuffle_runtime.store`` and
``shuffle_runtime.format``."""

from __future__ import annotations

from shuffle_runtime.store import Store


def files_under(store: Store, path: str) -> list[str]:
    if not store.exists(path):
        return []
    return [str(name) for name in store.filesystem.find(path)]
