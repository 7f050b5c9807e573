"""What the BabelQueue interop peers (consumer_peer.py on Redis, amqp_peer.py
on RabbitMQ) share: the producer, the worker, the Go SDK's seen-set layout,
the poison record and the command line. A peer supplies only its transport
and its own subcommands.

Subcommands every peer answers (one JSON document on stdout):

  publish URL QUEUE COUNT [--header NAME=VALUE]...  Python produces COUNT messages
  consume URL QUEUE IDLE_SECS [--OPTION VALUE]...    a Python worker until the queue is idle;
                                                     --seen-prefix P, --effects KEY, --noop 1
                                                     and the peer's own options
  poison-record                                      stdin {"body": [bytes], "block_json"}:
                                                     the SDK's poison record, {"record": [bytes]}
  redrive URL DLQ [--to Q] [--bypass 1]              the SDK's redrive of DLQ: what it did, and
                                                     how long it took (`seconds`)
  encode QUEUE COUNT                                 COUNT envelopes of URN for QUEUE as the
                                                     SDK encodes them, {"encoded": [text]}
"""

import json
import sys
import time

from babelqueue import BabelQueue, EnvelopeCodec, headers_from_context, is_replay
from babelqueue._poison_record import build_poison_record
from babelqueue.idempotency import wrap

URN = "urn:babel:interop:created"


def publish(app, count, headers):
    """COUNT messages of URN through `app`, with `headers` beside each when
    there are any; what was sent, for the test to compare."""
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


def consume(app, queue, idle, client, options):
    """Runs `app` as a worker on `queue` until it has been idle for `idle`
    seconds. With --effects, each run counts one in that Redis hash of
    `client`; with --seen-prefix, the handler is wrapped in that seen-set;
    with --noop 1, the handler does nothing; with --fail 1, it raises, so
    every message ends in the dead-letter queue."""
    effects, noop = options.get("--effects"), options.get("--noop") == "1"
    fail = options.get("--fail") == "1"
    received = []
    # When the first and the last handler call ran: a benchmark's measure of
    # the work alone, without the interpreter's start or a group join.
    timing = {"first": None, "last": None}

    def handler(data, meta, envelope):
        now = time.perf_counter()
        if timing["first"] is None:
            timing["first"] = now
        timing["last"] = now
        if fail:
            raise RuntimeError("the interop peer fails on purpose")
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
            # The SDK's own encoding of what it consumed, to compare bytes.
            "encoded": EnvelopeCodec.encode(envelope),
        })

    prefix = options.get("--seen-prefix")
    app.register(URN, wrap(RedisSeenSet(client, prefix), handler) if prefix else handler)
    processed = app.consume(queue, max_messages=10**9, timeout=idle, handle_signals=False)
    busy = timing["last"] - timing["first"] if timing["first"] is not None else 0.0
    return {"processed": processed, "received": received, "busy_seconds": busy}


def poison_record():
    request = json.load(sys.stdin)
    body = bytes(request["body"]).decode("utf-8", "surrogateescape")
    # The block as JSON text: json.loads keeps its key order, which the record's bytes show.
    record = build_poison_record(body, json.loads(request["block_json"]))
    return {"record": list(record.encode("utf-8", "surrogateescape"))}


def redrive_with(transport, dlq, options):
    """The SDK's `redrive` of `dlq` on `transport`, with --to, --bypass and
    --timeout (seconds each pop waits, 0.1 by default)."""
    import time

    from babelqueue.redrive import redrive

    started = time.perf_counter()
    result = redrive(
        transport,
        dlq,
        to_queue=options.get("--to"),
        bypass=options.get("--bypass") == "1",
        timeout=float(options.get("--timeout", "0.1")),
    )
    items = [
        {"message_id": i.message_id, "urn": i.urn, "reason": i.reason, "to": i.to,
         "redriven": i.redriven, "bypassed": i.bypassed}
        for i in result.items
    ]
    seconds = time.perf_counter() - started
    return {"redriven": result.redriven, "skipped": result.skipped, "items": items, "seconds": seconds}


def main(argv, app_for, consume_with, commands=None):
    """Runs the subcommand of `argv`. `app_for(url, queue)` makes the
    producer's BabelQueue; `consume_with(url, queue, idle, options)` runs the
    worker; `commands` maps the peer's own subcommands to functions of the
    arguments after the name."""
    command, args = argv[1], argv[2:]
    if command == "publish":
        headers = dict(h.split("=", 1) for h in args[3:] if h != "--header")
        out = publish(app_for(args[0], args[1]), int(args[2]), headers)
    elif command == "consume":
        options = dict(zip(args[3::2], args[4::2]))
        out = consume_with(args[0], args[1], float(args[2]), options)
    elif command == "poison-record":
        out = poison_record()
    elif command == "encode":
        out = {"encoded": [
            EnvelopeCodec.encode(EnvelopeCodec.make(URN, {"n": n, "text": "héllo"}, queue=args[0]))
            for n in range(int(args[1]))
        ]}
    elif commands and command in commands:
        out = commands[command](*args)
    else:
        raise SystemExit(f"unknown command {command!r}")
    json.dump(out, sys.stdout, ensure_ascii=False)
