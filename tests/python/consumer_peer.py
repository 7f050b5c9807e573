"""The Python SDK (babelqueue, pinned by .ci/python.sh) as the Redis interop
peer of tests/consumer_redis.rs and benches/consumer.rs. The subcommands every
peer answers are interop.py's (publish, consume, poison-record), on Redis; one
more:

  dlq URL DLQ    the DLQ read with Python's redrive (dry run)
  redrive URL DLQ [--to Q] [--bypass 1]   interop.py's redrive, on Redis
"""

import sys

import redis
from babelqueue import BabelQueue, EnvelopeCodec
from babelqueue.redis_transport import RedisTransport
from babelqueue.redrive import redrive

import interop


def app_for(url, queue):
    return BabelQueue(url, queue=queue)


def consume(url, queue, idle, options):
    """The worker: the seen-set and the effects live on the queue's server."""
    app = BabelQueue(transport=RedisTransport(url), queue=queue, dead_letter=True)
    return interop.consume(app, queue, idle, redis.Redis.from_url(url), options)


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


def redrive_command(url, dlq_name, *args):
    return interop.redrive_with(RedisTransport(url), dlq_name, dict(zip(args[::2], args[1::2])))


if __name__ == "__main__":
    interop.main(sys.argv, app_for, consume, {"dlq": dlq, "redrive": redrive_command})
