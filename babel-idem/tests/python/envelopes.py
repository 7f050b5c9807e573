"""Envelopes made by the BabelQueue Python SDK, for tests/envelope_python.rs.

Reads one JSON request per line on stdin and writes one JSON answer per line
on stdout, so a test batches every case into one Python process.

    python envelopes.py make     # a case -> the SDK's envelope, its retry and its dead-letter copy
    python envelopes.py compact  # {"text": ...} -> the SDK's compact encoding of that envelope

Answers carry the SDK's output as JSON strings (ASCII-escaped), so the bytes
survive the pipe exactly.
"""

import json
import sys

from babelqueue.codec import EnvelopeCodec
from babelqueue.dead_letter import annotate


def make(case):
    envelope = EnvelopeCodec.make(
        case["urn"],
        case["data"],
        queue=case["queue"],
        trace_id=case["trace_id"],
        meta=case["meta_extra"] or None,
    )
    meta_id = case["id"]
    if meta_id == "null":
        envelope["meta"]["id"] = None
    elif meta_id == "absent":
        del envelope["meta"]["id"]
    elif isinstance(meta_id, dict):
        envelope["meta"]["id"] = meta_id["set"]
    envelope["attempts"] = case["attempts"]
    envelope.update(case["top_extra"])

    retried = dict(envelope)
    retried["attempts"] = envelope["attempts"] + 1

    block = case["dead_letter"]
    dead = annotate(
        envelope,
        block["reason"],
        block["original_queue"],
        block["attempts"],
        error=block["error"],
        exception=block["exception"],
        lang="rust",
    )
    dead["dead_letter"]["failed_at"] = block["failed_at"]

    return {
        "envelope": EnvelopeCodec.encode(envelope),
        "retried": EnvelopeCodec.encode(retried),
        "dead_lettered": EnvelopeCodec.encode(dead),
    }


def compact(request):
    envelope = json.loads(request["text"])
    # The SDK never writes the inbound `urn` alias; `job` takes its place.
    if "job" not in envelope:
        envelope = {("job" if key == "urn" else key): value for key, value in envelope.items()}
    return {"encoded": EnvelopeCodec.encode(envelope)}


def main():
    answer = {"make": make, "compact": compact}[sys.argv[1]]
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))))


if __name__ == "__main__":
    main()
