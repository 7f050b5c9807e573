"""The Python SDK (babelqueue, pinned by .ci/python.sh) as the Redis interop
peer of tests/transport_redis_laravel.rs, on the Laravel-compatible layout:
every URL given carries ?laravel=1, which the SDK's RedisTransport reads (its
redis client is made from the URL without the query, which redis-py would
take for connection options). The
subcommands every peer answers are interop.py's (publish, consume,
poison-record); consume also takes --max-attempts N. Three more:

  publish-delayed URL QUEUE COUNT DELAY_SECS   COUNT envelopes through the SDK's
                                               publish_delayed; what was sent
  keys URL QUEUE                               what the queue's keys hold: ready,
                                               reserved, delayed, notify, dlq
  redrive URL DLQ [--to Q] [--bypass 1]        interop.py's redrive, on this layout
"""

import sys

import redis
from babelqueue import BabelQueue, EnvelopeCodec
from babelqueue.redis_transport import RedisTransport

import interop


def client_for(url):
    return redis.Redis.from_url(url.split("?")[0])


def transport_for(url):
    return RedisTransport(url, client=client_for(url))


def app_for(url, queue):
    return BabelQueue(transport=transport_for(url), queue=queue)


def consume(url, queue, idle, options):
    """The worker: the seen-set and the effects live on the queue's server."""
    app = BabelQueue(
        transport=transport_for(url),
        queue=queue,
        dead_letter=True,
        max_attempts=int(options.get("--max-attempts", "3")),
    )
    return interop.consume(app, queue, idle, client_for(url), options)


def publish_delayed(url, queue, count, delay):
    transport = transport_for(url)
    sent = []
    for n in range(int(count)):
        data = {"n": n, "text": "later"}
        envelope = EnvelopeCodec.make(interop.URN, data, queue=queue)
        transport.publish_delayed(queue, EnvelopeCodec.encode(envelope), float(delay))
        sent.append({"id": envelope["meta"]["id"], "urn": interop.URN, "data": data})
    return sent


def keys(url, queue):
    client = client_for(url)
    ready = "queues:" + queue

    def text(values):
        return [v.decode("utf-8", "replace") for v in values]

    return {
        "ready": text(client.lrange(ready, 0, -1)),
        "reserved": text(client.zrange(ready + ":reserved", 0, -1)),
        "delayed": [
            [m.decode("utf-8", "replace"), s]
            for m, s in client.zrange(ready + ":delayed", 0, -1, withscores=True)
        ],
        "notify": client.llen(ready + ":notify"),
        "dlq": text(client.lrange(ready + ".dlq", 0, -1)),
    }


def redrive(url, dlq, *args):
    return interop.redrive_with(transport_for(url), dlq, dict(zip(args[::2], args[1::2])))


if __name__ == "__main__":
    commands = {"publish-delayed": publish_delayed, "keys": keys, "redrive": redrive}
    interop.main(sys.argv, app_for, consume, commands)
