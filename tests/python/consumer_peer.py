"""The Python SDK (babelqueue, pinned by .ci/python.sh) as the interop peer of
tests/consumer_redis.rs. One subcommand per role; every result is one JSON
document on stdout.

  publish URL QUEUE COUNT [--header NAME=VALUE]...  Python produces COUNT messages
  consume URL QUEUE IDLE_SECS [--seen-prefix P] [--effects KEY] [--noop 1]
                                                     a Python worker until the queue is idle
  dlq URL DLQ                                        the DLQ read with Python's redrive (dry run)
  poison-record                                      stdin {"body_b64", "block_json"} -> the record
"""

import base64
import json
import sys

import redis
from babelqueue import BabelQueue, EnvelopeCodec, headers_from_context, is_replay
from babelqueue._poison_record import build_poison_record
from babelqueue.idempotency import wrap
from babelqueue.redis_transport import RedisTransport
from babelqueue.redrive import redrive

URN = "urn:babel:interop:created"


def publish(url, queue, count, headers):
    app = BabelQueue(url, queue=queue)
    sent = []
    for n in range(count):
        data = {"n": n, "text": "héllo \u2028 \"quoted\""}
        if headers:
            mid = app.publish_with_headers(URN, data, headers)
        else:
            mid = app.publish(URN, data)
        sent.append({"id": mid, "urn": URN, "data": data})
    return sent


class RedisSeenSet:
    """The Go SDK's seen-set layout: EXISTS / SET NX on <prefix><id>, value 1."""

    def __init__(self, client, prefix):
        self.client, self.prefix = client, prefix

    def seen(self, message_id):
        return bool(self.client.exists(self.prefix + message_id))

    def remember(self, message_id):
        self.client.set(self.prefix + message_id, "1", nx=True)

    def forget(self, message_id):
        self.client.delete(self.prefix + message_id)


def consume(url, queue, idle, seen_prefix, effects, noop=False):
    client = redis.Redis.from_url(url)
    app = BabelQueue(transport=RedisTransport(url), queue=queue, dead_letter=True)
    received = []

    def handler(data, meta, envelope):
        if noop:
            return
        if effects:
            client.hincrby(effects, meta["id"], 1)
        received.append({
            "id": meta.get("id"),
            "urn": envelope.get("job"),
            "data": data,
            "attempts": envelope.get("attempts"),
            "lang": meta.get("lang"),
            "headers": dict(headers_from_context()),
            "replay": is_replay(),
        })

    app.register(URN, wrap(RedisSeenSet(client, seen_prefix), handler) if seen_prefix else handler)
    processed = app.consume(queue, max_messages=10**9, timeout=idle, handle_signals=False)
    return {"processed": processed, "received": received}


def dlq(url, queue):
    client = redis.Redis.from_url(url)
    records = []
    for raw in client.lrange(queue, 0, -1):
        try:
            records.append(EnvelopeCodec.decode(raw.decode("utf-8")))
        except Exception as exc:  # noqa: BLE001 - reported, the test decides
            records.append({"undecodable": str(exc)})
    result = redrive(RedisTransport(url), queue, dry_run=True, timeout=0.1)
    items = [
        {"message_id": i.message_id, "urn": i.urn, "reason": i.reason, "to": i.to}
        for i in result.items
    ]
    return {"items": items, "records": records, "left": client.llen(queue)}


def poison_record():
    request = json.load(sys.stdin)
    body = base64.b64decode(request["body_b64"]).decode("utf-8", "surrogateescape")
    # The block as JSON text: json.loads keeps its key order, which the record's bytes show.
    record = build_poison_record(body, json.loads(request["block_json"]))
    return {"record_b64": base64.b64encode(record.encode("utf-8", "surrogateescape")).decode("ascii")}


def main(argv):
    command = argv[1]
    if command == "publish":
        headers = dict(h.split("=", 1) for h in argv[5:] if h != "--header")
        out = publish(argv[2], argv[3], int(argv[4]), headers)
    elif command == "consume":
        options = dict(zip(argv[5::2], argv[6::2]))
        out = consume(
            argv[2], argv[3], float(argv[4]), options.get("--seen-prefix"), options.get("--effects"),
            options.get("--noop") == "1",
        )
    elif command == "dlq":
        out = dlq(argv[2], argv[3])
    elif command == "poison-record":
        out = poison_record()
    else:
        raise SystemExit(f"unknown command {command!r}")
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv)
