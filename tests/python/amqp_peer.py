"""The Python SDK (babelqueue, pinned by .ci/python.sh, `amqp` extra) as the
RabbitMQ interop peer of tests/consumer_amqp.rs and benches/consumer_amqp.rs.
One subcommand per role; every result is one JSON document on stdout.

  publish URL QUEUE COUNT [--header NAME=VALUE]...   Python produces COUNT messages
  publish-raw URL QUEUE                              stdin {"bodies": [...], "headers": {...}}:
                                                     PikaTransport publishes each body as given
  consume URL QUEUE IDLE_SECS [--redis URL] [--seen-prefix P] [--effects KEY] [--noop 1]
                                                     a Python worker until the queue is idle
  poison-record                                      stdin {"body": [bytes], "block_json"}: the
                                                     SDK's ADR-0035 record, {"record": [bytes]}
"""

import json
import sys

from babelqueue import BabelQueue, headers_from_context, is_replay
from babelqueue._poison_record import build_poison_record
from babelqueue.idempotency import wrap
from babelqueue.pika_transport import PikaTransport
# The Go SDK's seen-set layout, as the Redis peer writes it.
from consumer_peer import RedisSeenSet

URN = "urn:babel:interop:created"


def publish(url, queue, count, headers):
    app = BabelQueue(transport=PikaTransport(url), queue=queue)
    sent = []
    for n in range(count):
        data = {"n": n, "text": "héllo \u2028 \"quoted\""}
        if headers:
            mid = app.publish_with_headers(URN, data, headers)
        else:
            mid = app.publish(URN, data)
        sent.append({"id": mid, "urn": URN, "data": data})
    return sent


def publish_raw(url, queue):
    request = json.load(sys.stdin)
    transport = PikaTransport(url)
    for body in request["bodies"]:
        if request.get("headers"):
            transport.publish_with_headers(queue, body, request["headers"])
        else:
            transport.publish(queue, body)
    transport.close()
    return {"published": len(request["bodies"])}


def consume(url, queue, idle, options):
    client = None
    if options.get("--redis"):
        import redis

        client = redis.Redis.from_url(options["--redis"])
    effects, noop = options.get("--effects"), options.get("--noop") == "1"
    transport = PikaTransport(url)
    app = BabelQueue(transport=transport, queue=queue, dead_letter=True)
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

    prefix = options.get("--seen-prefix")
    app.register(URN, wrap(RedisSeenSet(client, prefix), handler) if prefix else handler)
    processed = app.consume(queue, max_messages=10**9, timeout=idle, handle_signals=False)
    transport.close()
    return {"processed": processed, "received": received}


def poison_record():
    request = json.load(sys.stdin)
    body = bytes(request["body"]).decode("utf-8", "surrogateescape")
    # The block as JSON text: json.loads keeps its key order, which the record's bytes show.
    record = build_poison_record(body, json.loads(request["block_json"]))
    return {"record": list(record.encode("utf-8", "surrogateescape"))}


def main(argv):
    command = argv[1]
    if command == "publish":
        headers = dict(h.split("=", 1) for h in argv[5:] if h != "--header")
        out = publish(argv[2], argv[3], int(argv[4]), headers)
    elif command == "publish-raw":
        out = publish_raw(argv[2], argv[3])
    elif command == "consume":
        options = dict(zip(argv[5::2], argv[6::2]))
        out = consume(argv[2], argv[3], float(argv[4]), options)
    elif command == "poison-record":
        out = poison_record()
    else:
        raise SystemExit(f"unknown command {command!r}")
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv)
