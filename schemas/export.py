"""`gpuledger schemas export DIR`: the contracts as a downstream consumer needs them, in the repo's layout.

    DIR/<subject>.avsc                   the latest version of every subject (what writers use now)
    DIR/history/<subject>/<n>.avsc       older versions (readers still meet them on the topics)
    DIR/topics.json                      every public topic: subject, key, partitions, cleanup, retention

The files are copied byte for byte, so any Avro library parses them as the project does; Java's
`SchemaStore.Cache` loaded with every `.avsc` here resolves every single-object record on the topics.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from schemas import HISTORY, SchemaStore
from schemas.topics import CATALOGUE


def topic_index(prefix: str = "") -> list[dict[str, object]]:
    """The catalogue as data (names with `prefix`)."""
    return [
        {
            "topic": prefix + t.name,
            "subject": t.subject,
            "key": t.key,
            "partitions": t.partitions,
            "cleanup_policy": t.cleanup_policy,
            "retention_ms": t.retention_ms,
            "dead_letter_topic": prefix + t.dlq,
        }
        for t in CATALOGUE
    ]


def export_schemas(store: SchemaStore, dest: Path, prefix: str = "") -> list[Path]:
    """Copy every subject's versions into `dest` and write `topics.json`; returns the files written."""
    written: list[Path] = []
    dest.mkdir(parents=True, exist_ok=True)
    for subject in store.subjects():
        target = dest / f"{subject}.avsc"
        shutil.copyfile(store.root / f"{subject}.avsc", target)
        written.append(target)
        for number, path in enumerate(store.history_paths(subject), start=1):
            old = dest / HISTORY / subject / f"{number}.avsc"
            old.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, old)
            written.append(old)
    index = dest / "topics.json"
    index.write_text(json.dumps(topic_index(prefix), indent=2) + "\n", encoding="utf-8")
    written.append(index)
    return written
