"""The BabelQueue Python SDK (babelqueue, pinned by .ci/python.sh) as the
peer of tests/consumer_schema.rs, on Redis or RabbitMQ: the producer of
valid and invalid payloads, a worker whose handler is wrapped in the SDK's
consume-side schema check, and the dead-letter reader.

BROKER is `redis` (the SDK's RedisTransport) or `amqp` (its PikaTransport).
Each subcommand writes one JSON document on stdout:

  publish BROKER URL QUEUE           stdin {"messages": [{"urn": U, "data": TEXT}]}:
                                     BabelQueue.publish of each, in order; the data
                                     is JSON text, so its member order reaches the
                                     wire as written. {"sent": [{"id", "urn"}]}
  worker BROKER URL QUEUE REGISTRY URN IDLE_SECS
                                     a BabelQueue worker (dead_letter=True,
                                     max_attempts=3) whose URN handler is
                                     babelqueue.schema.wrap(DirProvider(REGISTRY), URN, h),
                                     until the queue is idle; {"processed", "handled": [id]}
  dead-letters BROKER URL DLQ        the DLQ as the SDK reads it: its redrive plan
                                     (dry run, which puts every record back), then each
                                     record popped, decoded with EnvelopeCodec and acked;
                                     {"items": [...], "records": [...]}
"""

import json
import sys
import time

from babelqueue import BabelQueue, EnvelopeCodec
from babelqueue.redrive import redrive
from babelqueue.schema import DirProvider, wrap


def transport_for(broker, url):
    if broker == "redis":
        from babelqueue.redis_transport import RedisTransport

        return RedisTransport(url)
    if broker == "amqp":
        from babelqueue.pika_transport import PikaTransport

        return PikaTransport(url)
    raise SystemExit(f"unknown broker {broker!r}")


def publish(transport, queue):
    request = json.load(sys.stdin)
    app = BabelQueue(transport=transport, queue=queue)
    sent = []
    for message in request["messages"]:
        data = json.loads(message["data"])
        sent.append({"id": app.publish(message["urn"], data), "urn": message["urn"]})
    return {"sent": sent}


def worker(transport, queue, registry, urn, idle):
    app = BabelQueue(transport=transport, queue=queue, dead_letter=True, max_attempts=3)
    handled = []

    def handler(data, meta):
        handled.append(meta.get("id"))

    app.register(urn, wrap(DirProvider(registry), urn, handler))
    processed = app.consume(queue, max_messages=10**9, timeout=float(idle), handle_signals=False)
    return {"processed": processed, "handled": handled}


def dead_letters(transport, dlq):
    plan = redrive(transport, dlq, dry_run=True, timeout=0.1)
    items = [
        {"message_id": i.message_id, "urn": i.urn, "reason": i.reason, "to": i.to}
        for i in plan.items
    ]
    # The dry run published every record back; read as many as it planned,
    # giving the broker a moment to show the last of them.
    records = []
    deadline = time.monotonic() + 30
    while len(records) < len(items) and time.monotonic() < deadline:
        message = transport.pop(dlq, 0.1)
        if message is None:
            continue
        records.append(EnvelopeCodec.decode(message.body))
        transport.ack(message)
    return {"items": items, "records": records}


def main(argv):
    command, broker, url, *rest = argv[1:]
    transport = transport_for(broker, url)
    if command == "publish":
        out = publish(transport, *rest)
    elif command == "worker":
        out = worker(transport, *rest)
    elif command == "dead-letters":
        out = dead_letters(transport, *rest)
    else:
        raise SystemExit(f"unknown command {command!r}")
    close = getattr(transport, "close", None)
    if close is not None:
        close()
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv)
