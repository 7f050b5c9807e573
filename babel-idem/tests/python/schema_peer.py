"""The BabelQueue Python SDK's payload schema check, for tests/schema_parity.rs.

Reads one JSON request per line on stdin, {"schema": <JSON text>, "data": <JSON
text>}, and writes one JSON answer per line on stdout, {"violation": <text or
null>}, so a test sends every pair to one Python process. Both are sent as
JSON text so the data's member order reaches ``json.loads`` as written.

Object data goes through ``babelqueue.schema.check`` with a ``MapProvider``
holding the schema; data that is not an object (``check`` only takes a
mapping) goes to ``validate_schema``, which ``check`` calls. An exception is
answered as {"error": ...}.

    python schema_peer.py < pairs.jsonl
"""

import json
import sys

from babelqueue.schema import MapProvider, check, validate_schema

URN = "urn:babel:parity:checked"


def answer(request):
    schema = json.loads(request["schema"])
    data = json.loads(request["data"])
    if isinstance(data, dict):
        return {"violation": check(MapProvider({URN: schema}), URN, data)}
    return {"violation": validate_schema(schema, data)}


def main():
    out = sys.stdout
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            reply = answer(json.loads(line.decode("utf-8")))
        except Exception as error:  # noqa: BLE001 - every failure is an answer
            reply = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(reply) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
