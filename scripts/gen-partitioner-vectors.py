#!/usr/bin/env python3
"""Writes tests/vectors/partitioner.jsonl: bucket labels computed with an
implementation independent of outboxd (Python's zlib.crc32, IEEE CRC-32).

The Rust partitioner and the SQL function outbox_partition_for() are both
tested against this file. Run it again only to add keys; never to "fix" a
failing test.
"""
import json
import zlib
from pathlib import Path

KEYS = [
    "", "a", "abc", "order-1", "order-2", "order-42", "customer:123",
    "123456789", "The quick brown fox jumps over the lazy dog",
    "ÄÖÜ-straße", "日本語キー", "emoji-🚀", " leading space", "trailing space ",
    "UPPER", "upper", "x" * 300,
] + [f"key-{i}" for i in range(0, 200, 7)] + [f"tenant/{i}/invoice" for i in range(20)]


def label(bucket: int, count: int) -> str:
    width = max(2, len(str(count)))
    return "p" + str(bucket).zfill(width)


out = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "partitioner.jsonl"
with out.open("w", encoding="utf-8") as f:
    for key in KEYS:
        crc = zlib.crc32(key.encode("utf-8")) & 0xFFFFFFFF
        row = {"key": key, "crc32": crc}
        for count in (1, 7, 16, 100, 1000):
            row[f"label_{count}"] = label(crc % count, count)
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
print(f"wrote {len(KEYS)} vectors to {out}")
