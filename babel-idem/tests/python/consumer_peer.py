"""The Python SDK (babelqueue, pinned by .ci/python.sh) as the Redis interop
peer of tests/consumer_redis.rs and benches/consumer.rs. The subcommands every
peer answers are interop.py's (publish, consume, poison-record), on Redis; one
more:

  dlq URL DLQ    the DLQ read with Python's redrive (dry run)
  redrive URL DLQ [--to Q] [--bypass 1]   interop.py's redrive, on Redis

A redis+cluster://host:port[,host:port...] URL is a Redis Cluster: the SDK's
RedisTransport is given a redis.cluster.RedisCluster client on those seed
nodes (the queue names carry a hash tag, so each queue's keys share a slot).
"""

import sys

import redis
from redis.cluster import ClusterNode, RedisCluster
from babelqueue import BabelQueue, EnvelopeCodec
from babelqueue.redis_transport import RedisTransport
from babelqueue.redrive import redrive

import interop


CLUSTER_SCHEME = "redis+cluster://"


def client_for(url):
    """A client for `url`: a RedisCluster on the seed nodes of a cluster URL."""
    if not url.startswith(CLUSTER_SCHEME):
        return redis.Redis.from_url(url)
    hosts = url[len(CLUSTER_SCHEME):].split("/")[0].split(",")
    nodes = [ClusterNode(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in hosts if h]
    return RedisCluster(startup_nodes=nodes)


def transport_for(url):
    if url.startswith(CLUSTER_SCHEME):
        return RedisTransport(client=client_for(url))
    return RedisTransport(url)


def app_for(url, queue):
    if url.startswith(CLUSTER_SCHEME):
        return BabelQueue(transport=transport_for(url), queue=queue)
    return BabelQueue(url, queue=queue)


def consume(url, queue, idle, options):
    """The worker: the seen-set and the effects live on the queue's server."""
    app = BabelQueue(transport=transport_for(url), queue=queue, dead_letter=True)
    return interop.consume(app, queue, idle, client_for(url), options)


def dlq(url, queue):
    client = client_for(url)
    records = []
    for raw in client.lrange(queue, 0, -1):
        try:
            records.append(EnvelopeCodec.decode(raw.decode("utf-8")))
        except Exception as exc:  # noqa: BLE001 - reported, the test decides
            records.append({"undecodable": str(exc)})
    result = redrive(transport_for(url), queue, dry_run=True, timeout=0.1)
    items = [
        {"message_id": i.message_id, "urn": i.urn, "reason": i.reason, "to": i.to}
        for i in result.items
    ]
    return {"items": items, "records": records, "left": client.llen(queue)}


def redrive_command(url, dlq_name, *args):
    return interop.redrive_with(RedisTransport(url), dlq_name, dict(zip(args[::2], args[1::2])))


if __name__ == "__main__":
    interop.main(sys.argv, app_for, consume, {"dlq": dlq, "redrive": redrive_command})
