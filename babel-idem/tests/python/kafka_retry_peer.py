"""The Python SDK (babelqueue, `kafka` extra: confluent-kafka) as the Kafka
retry-tier peer of tests/kafka_reinject.rs. One JSON document on stdout.

  publish-delayed URL QUEUE DELAY_MS TIERS_MS     stdin {"body": "..."}: KafkaTransport(
                                                  retry_tiers_ms=TIERS_MS).publish_delayed,
                                                  {"published": 1}
  reinject URL QUEUE TIERS_MS GROUP COUNT SECS    RetryReinjector.run_once until COUNT records
                                                  are written or SECS pass, {"written": N}

TIERS_MS is a comma-separated list of milliseconds, as retry_tiers_ms takes it.
"""

import json
import sys
import time

from babelqueue.kafka_retry import RetryReinjector
from babelqueue.kafka_transport import KafkaTransport


def tiers(text):
    return [int(tier) for tier in text.split(",")]


def publish_delayed(url, queue, delay_ms, tiers_ms):
    body = json.load(sys.stdin)["body"]
    transport = KafkaTransport(url, retry_tiers_ms=tiers(tiers_ms))
    transport.publish_delayed(queue, body, int(delay_ms))
    transport.close()
    return {"published": 1}


def reinject(url, queue, tiers_ms, group, count, secs):
    reinjector = RetryReinjector(
        url, work_topics=[queue], retry_tiers_ms=tiers(tiers_ms), group_id=group
    )
    written = 0
    deadline = time.time() + float(secs)
    try:
        while written < int(count) and time.time() < deadline:
            written += reinjector.run_once(timeout=0.2)
    finally:
        reinjector.close()
    return {"written": written}


def main(argv):
    command, args = argv[0], argv[1:]
    if command == "publish-delayed":
        answer = publish_delayed(*args)
    elif command == "reinject":
        answer = reinject(*args)
    else:
        raise SystemExit("unknown subcommand %r" % command)
    print(json.dumps(answer))


if __name__ == "__main__":
    main(sys.argv[1:])
