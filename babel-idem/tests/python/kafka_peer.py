"""The Python SDK (babelqueue, pinned by .ci/python.sh, `kafka` extra: confluent-kafka) as the
Kafka interop peer of tests/consumer_kafka.rs and benches/consumer_kafka.rs. The subcommands
every peer answers are interop.py's (publish, consume, poison-record), on Kafka; `consume` takes
more options, and there are more subcommands:

  consume URL TOPIC IDLE_SECS --redis URL [--group G] [--tiers MS,MS] [--max-attempts N] ...
                                       the worker in group G (default babelqueue); the seen-set
                                       and the effects on the --redis server; with --tiers, the
                                       SDK's retry tiers; N attempts (default 3: without tiers a
                                       failure retries only with N = 1, dead-lettered at once)
  records URL TOPIC [IDLE_SECS]        every record of TOPIC, read by a throwaway group without
                                       committing: value (bytes), key (bytes or null), headers
                                       ([name, bytes]), timestamp, partition, offset
  publish-body URL TOPIC               stdin {"bodies": [text]}: each published by the SDK's
                                       KafkaTransport.publish (its header projection), confirmed
  publish-raw URL TOPIC                stdin {"records": [{"value": [bytes], "key": [bytes]|null,
                                       "headers": [[name, [bytes]]]}]}: produced as given, confirmed
  publish-delayed URL TOPIC DELAY_MS TIERS   one envelope parked by the SDK's publish_delayed
                                       on the tiers (MS,MS,...): stdin {"body": text} when given,
                                       else one of URN; what was sent
  reinject URL TOPIC TIERS SECS [--group G] [--count N]   the SDK's RetryReinjector (in group G
                                       when given) on TOPIC's tiers for SECS seconds, or until it
                                       wrote N records; how many records it wrote
  redrive URL DLQ [--to Q] [--bypass 1] [--group G] [--timeout SECS]   interop.py's redrive, on
                                       Kafka; each pop waits SECS (a group join on the broker
                                       takes longer than the 0.1 s default)
  pop URL TOPIC GROUP COUNT            COUNT records popped through the SDK's KafkaTransport in
                                       GROUP (60 s at most), each acked; their bodies as the SDK
                                       hands them over
"""

import atexit
import json
import sys
import time
import uuid

from babelqueue import BabelQueue, EnvelopeCodec
from babelqueue.kafka_transport import KafkaTransport

import interop


def tiers_of(text):
    return [int(ms) for ms in text.split(",") if ms] if text else None


def app_for(url, queue):
    # The SDK's publish is fire-and-forget: the producer is flushed (every record confirmed)
    # before the peer answers and exits.
    transport = KafkaTransport(url)
    atexit.register(transport.close)
    return BabelQueue(transport=transport, queue=queue)


def consume(url, topic, idle, options):
    """The worker: the seen-set and the effects live on the --redis server."""
    client = None
    if options.get("--redis"):
        import redis

        client = redis.Redis.from_url(options["--redis"])
    transport = KafkaTransport(
        url,
        group_id=options.get("--group", "babelqueue"),
        retry_tiers_ms=tiers_of(options.get("--tiers")),
        **{"session.timeout.ms": 6000},
    )
    app = BabelQueue(
        transport=transport,
        queue=topic,
        dead_letter=True,
        max_attempts=int(options.get("--max-attempts", 3)),
    )
    out = interop.consume(app, topic, idle, client, options)
    transport.close()
    return out


def records(url, topic, idle="3"):
    from confluent_kafka import Consumer

    brokers = url.split("://", 1)[1]
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "babel-idem-test-reader-" + uuid.uuid4().hex,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    out = []
    quiet_until = time.time() + float(idle)
    while time.time() < quiet_until:
        message = consumer.poll(0.2)
        if message is None or message.error() is not None:
            continue
        quiet_until = time.time() + float(idle)
        key = message.key()
        out.append(
            {
                "value": list(message.value() or b""),
                "key": None if key is None else list(key),
                "headers": [[name, list(value or b"")] for name, value in (message.headers() or [])],
                "timestamp": message.timestamp()[1],
                "partition": message.partition(),
                "offset": message.offset(),
            }
        )
    consumer.close()
    out.sort(key=lambda r: (r["partition"], r["offset"]))
    return {"records": out}


def publish_raw(url, topic):
    from confluent_kafka import Producer

    request = json.load(sys.stdin)
    producer = Producer({"bootstrap.servers": url.split("://", 1)[1]})
    failures = []
    for record in request["records"]:
        kwargs = {"value": bytes(record["value"])}
        if record.get("key") is not None:
            kwargs["key"] = bytes(record["key"])
        if record.get("headers"):
            kwargs["headers"] = [(name, bytes(value)) for name, value in record["headers"]]
        producer.produce(topic, on_delivery=lambda err, _msg: err and failures.append(str(err)), **kwargs)
    producer.flush(30)
    if failures:
        raise SystemExit("delivery failed: %s" % failures)
    return {"published": len(request["records"])}


def publish_body(url, topic):
    request = json.load(sys.stdin)
    transport = KafkaTransport(url)
    for body in request["bodies"]:
        transport.publish(topic, body)
    transport.close()
    return {"published": len(request["bodies"])}


def publish_delayed(url, topic, delay_ms, tiers):
    request = sys.stdin.read()
    if request.strip():
        body = json.loads(request)["body"]
    else:
        body = EnvelopeCodec.encode(
            EnvelopeCodec.make(interop.URN, {"n": 0, "text": "delayed"}, queue=topic)
        )
    transport = KafkaTransport(url, retry_tiers_ms=tiers_of(tiers))
    transport.publish_delayed(topic, body, int(delay_ms))
    transport.close()
    return {"id": EnvelopeCodec.decode_lenient(body).get("meta", {}).get("id"), "body": body}


def reinject(url, topic, tiers, seconds, *args):
    from babelqueue.kafka_retry import RetryReinjector

    options = dict(zip(args[::2], args[1::2]))
    group = {"group_id": options["--group"]} if "--group" in options else {}
    count = int(options["--count"]) if "--count" in options else None
    reinjector = RetryReinjector(
        url, work_topics=[topic], retry_tiers_ms=tiers_of(tiers), poll_interval=0.2, **group
    )
    written = 0
    until = time.time() + float(seconds)
    try:
        while time.time() < until and (count is None or written < count):
            written += reinjector.run_once(timeout=0.2)
    finally:
        reinjector.close()
    return {"written": written}


def redrive_command(url, dlq, *args):
    options = dict(zip(args[::2], args[1::2]))
    transport = KafkaTransport(url, group_id=options.pop("--group", "babelqueue-redrive"))
    out = interop.redrive_with(transport, dlq, options)
    transport.close()
    return out


def pop(url, topic, group, count):
    transport = KafkaTransport(url, group_id=group)
    bodies, deadline = [], time.time() + 60
    while len(bodies) < int(count) and time.time() < deadline:
        message = transport.pop(topic, timeout=1.0)
        if message is None:
            continue
        bodies.append(message.body)
        transport.ack(message)
    transport.close()
    return {"bodies": bodies}


if __name__ == "__main__":
    interop.main(
        sys.argv,
        app_for,
        consume,
        {
            "records": records,
            "publish-body": publish_body,
            "publish-raw": publish_raw,
            "publish-delayed": publish_delayed,
            "reinject": reinject,
            "redrive": redrive_command,
            "pop": pop,
        },
    )
