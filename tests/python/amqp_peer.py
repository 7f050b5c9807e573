"""The Python SDK (babelqueue, pinned by .ci/python.sh, `amqp` extra) as the
RabbitMQ interop peer of tests/consumer_amqp.rs and benches/consumer_amqp.rs.
The subcommands every peer answers are interop.py's (publish, consume,
poison-record), on RabbitMQ; `consume` takes one more option, and there is
one more subcommand:

  consume URL QUEUE IDLE_SECS --redis URL ...   the server of the seen-set and the effects
  publish-raw URL QUEUE                          stdin {"bodies": [...], "headers": {...}}:
                                                 PikaTransport publishes each body as given
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


if __name__ == "__main__":
    interop.main(sys.argv, app_for, consume, {"publish-raw": publish_raw})
