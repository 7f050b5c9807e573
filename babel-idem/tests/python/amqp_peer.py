"""The Python SDK (babelqueue, pinned by .ci/python.sh, `amqp` extra) as the
RabbitMQ interop peer of tests/consumer_amqp.rs and benches/consumer_amqp.rs.
The subcommands every peer answers are interop.py's (publish, consume,
poison-record), on RabbitMQ; `consume` takes one more option, and there is
one more subcommand:

  consume URL QUEUE IDLE_SECS --redis URL ...   the server of the seen-set and the effects
  publish-raw URL QUEUE                          stdin {"bodies": [...], "headers": {...}}:
                                                 PikaTransport publishes each body as given
  publish-unreadable URL QUEUE                   stdin {"body": "...", "field": "header"|"message_id"|"deep"}:
                                                 pika publishes the body with a header name, or a
                                                 message_id, that is not UTF-8 (bytes as given), or
                                                 with headers nested "depth" tables deep
  redrive URL DLQ [--to Q] [--bypass 1]          interop.py's redrive, on RabbitMQ
"""

import json
import sys

from babelqueue import BabelQueue
from babelqueue.pika_transport import PikaTransport

import interop


def app_for(url, queue):
    return BabelQueue(transport=PikaTransport(url), queue=queue)


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


# Not UTF-8: RabbitMQ takes such short strings, and pika sends bytes as given.
NOT_UTF8 = b"\xff\xfe-not-utf8"


def deeply_nested_properties(depth):
    """Persistent properties whose headers hold one value nested `depth`
    tables deep, encoded by hand: pika's own encoder recurses per level."""
    import struct

    import pika

    value = b"S" + struct.pack(">I", 6) + b"bottom"
    for _ in range(depth):
        field = b"\x01n" + value
        value = b"F" + struct.pack(">I", len(field)) + field
    fields = b"\x04deep" + value
    table = struct.pack(">I", len(fields)) + fields

    class Deep(pika.BasicProperties):
        def encode(self):
            # headers (bit 13) and delivery-mode (bit 12), in that order.
            return [struct.pack(">H", (1 << 13) | (1 << 12)), table, b"\x02"]

    return Deep()


def publish_unreadable(url, queue):
    import pika

    request = json.load(sys.stdin)
    if request["field"] == "deep":
        properties = deeply_nested_properties(request["depth"])
    elif request["field"] == "header":
        properties = pika.BasicProperties(delivery_mode=2, headers={NOT_UTF8: "value"})
    else:
        properties = pika.BasicProperties(delivery_mode=2, message_id=NOT_UTF8)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    channel.basic_publish("", queue, request["body"].encode(), properties)
    connection.close()
    return {"published": 1}


def consume(url, queue, idle, options):
    """The worker: the seen-set and the effects live on the --redis server."""
    client = None
    if options.get("--redis"):
        import redis

        client = redis.Redis.from_url(options["--redis"])
    transport = PikaTransport(url)
    app = BabelQueue(transport=transport, queue=queue, dead_letter=True)
    out = interop.consume(app, queue, idle, client, options)
    transport.close()
    return out


def redrive_command(url, dlq, *args):
    transport = PikaTransport(url)
    out = interop.redrive_with(transport, dlq, dict(zip(args[::2], args[1::2])))
    transport.close()
    return out


if __name__ == "__main__":
    interop.main(
        sys.argv,
        app_for,
        consume,
        {"publish-raw": publish_raw, "publish-unreadable": publish_unreadable, "redrive": redrive_command},
    )
