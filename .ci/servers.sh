# shellcheck shell=bash
# Makes sure Redis, PostgreSQL, RabbitMQ, a Kafka-protocol broker (tansu) and faketime (for the
# clock-skew tests) are installed, running and answering, then exports what the store and
# transport tests read:
#   BABEL_IDEM_REDIS_URL, BABEL_IDEM_REDIS_CLUSTER_URL, BABEL_IDEM_POSTGRES_URL,
#   BABEL_IDEM_AMQP_URL, BABEL_IDEM_KAFKA_URL, BABEL_IDEM_REQUIRE_SERVERS=1
#
# Sourced by .ci/run (as root, CI=true): `source .ci/servers.sh`. It only
# defines functions and calls one, so the caller's shell options stay as
# they were; it returns non-zero (and says why) when a server cannot be had.
# The outage tests start servers of their own from the same packages.

babel_idem_servers_say() { printf 'servers: %s\n' "$*" >&2; }

# Installs what is missing: redis-server, and the PostgreSQL server (initdb,
# pg_ctl, pg_createcluster) with psql, and rabbitmq-server.
babel_idem_servers_install() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
  command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
  command -v pg_createcluster >/dev/null 2>&1 || missing+=(postgresql-common)
  command -v rabbitmq-server >/dev/null 2>&1 || missing+=(rabbitmq-server)
  # The clock-skew tests run a worker under faketime.
  command -v faketime >/dev/null 2>&1 || missing+=(faketime)
  if [ "${#missing[@]}" -gt 0 ]; then
    babel_idem_servers_say "installing ${missing[*]}"
    apt-get update -qq || return 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || return 1
  fi
}

# Waits up to 30 s for "$@" to succeed.
babel_idem_servers_wait() {
  local tries=0
  until "$@" >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ "$tries" -ge 60 ] && return 1
    sleep 0.5
  done
}

babel_idem_redis_answers() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; }

babel_idem_servers_redis() {
  if ! babel_idem_redis_answers; then
    babel_idem_servers_say "starting redis-server on 127.0.0.1:6379"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log || return 1
  fi
  babel_idem_servers_wait babel_idem_redis_answers || {
    babel_idem_servers_say "redis-server does not answer; its log: /var/log/redis/ci.log"
    return 1
  }
  export BABEL_IDEM_REDIS_URL=redis://127.0.0.1:6379/
}

# A Redis Cluster of 3 masters and 3 replicas on 127.0.0.1:7000-7005, one
# folder per node under /var/lib/redis/cluster. A cluster that already
# answers `cluster_state:ok` on every port is reused as it is; nothing is
# stopped here, and a node this function did not start is never touched.
BABEL_IDEM_CLUSTER_PORTS="7000 7001 7002 7003 7004 7005"

babel_idem_cluster_node_ok() {
  redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

babel_idem_cluster_ok() {
  local port
  for port in $BABEL_IDEM_CLUSTER_PORTS; do
    babel_idem_cluster_node_ok "$port" || return 1
  done
}

babel_idem_servers_redis_cluster() {
  local root=/var/lib/redis/cluster port started=() nodes=()
  if ! babel_idem_cluster_ok; then
    for port in $BABEL_IDEM_CLUSTER_PORTS; do
      if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; then
        # Something answers on the port: a node of ours that has not
        # formed a cluster yet, or a server that is none of ours.
        redis-cli -h 127.0.0.1 -p "$port" info cluster 2>/dev/null | grep -q '^cluster_enabled:1' || {
          babel_idem_servers_say "127.0.0.1:$port answers but is not a cluster node; not touching it"
          return 1
        }
        continue
      fi
      mkdir -p "$root/$port"
      redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$root/$port" \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
        --repl-diskless-sync-delay 0 \
        --save "" --appendonly no --logfile "$root/$port/redis.log" || return 1
      started+=("$port")
    done
    for port in $BABEL_IDEM_CLUSTER_PORTS; do
      babel_idem_servers_wait redis-cli -h 127.0.0.1 -p "$port" ping || {
        babel_idem_servers_say "cluster node 127.0.0.1:$port does not answer; its log: $root/$port/redis.log"
        return 1
      }
      nodes+=("127.0.0.1:$port")
    done
    # Create the cluster only from nodes that know no other node yet.
    if [ "$(redis-cli -h 127.0.0.1 -p 7000 cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')" = 1 ]; then
      babel_idem_servers_say "creating a Redis Cluster on ${nodes[*]} (started: ${started[*]:-none})"
      redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null || return 1
    fi
    babel_idem_servers_wait babel_idem_cluster_ok || {
      babel_idem_servers_say "the Redis Cluster on 7000-7005 never reached cluster_state:ok"
      return 1
    }
  fi
  export BABEL_IDEM_REDIS_CLUSTER_URL="redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002/"
}

babel_idem_servers_postgres() {
  local version port
  version=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$version" ] || { babel_idem_servers_say "no PostgreSQL under /usr/lib/postgresql"; return 1; }
  # A fresh install may have no cluster yet (or one for another version).
  if [ ! -d "/etc/postgresql/$version/main" ]; then
    babel_idem_servers_say "creating the PostgreSQL $version cluster 'main'"
    pg_createcluster "$version" main >/dev/null || return 1
  fi
  port=$(pg_conftool -s "$version" main show port 2>/dev/null || echo 5432)
  if ! pg_isready -q -h 127.0.0.1 -p "$port"; then
    babel_idem_servers_say "starting PostgreSQL $version/main on port $port"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || return 1
  fi
  babel_idem_servers_wait pg_isready -q -h 127.0.0.1 -p "$port" || {
    babel_idem_servers_say "PostgreSQL does not answer; its logs: /var/log/postgresql/"
    return 1
  }
  # A fresh cluster authenticates TCP logins by password (scram-sha-256):
  # give the CI-only superuser one, over the local socket (peer auth).
  runuser -u postgres -- psql -q -p "$port" -c "ALTER USER postgres PASSWORD 'postgres'" >/dev/null || return 1
  export BABEL_IDEM_POSTGRES_URL="postgres://postgres:postgres@127.0.0.1:$port/postgres"
  PGPASSWORD=postgres psql -q -h 127.0.0.1 -p "$port" -U postgres -Atc 'SELECT 1' >/dev/null || {
    babel_idem_servers_say "cannot log in to $BABEL_IDEM_POSTGRES_URL"
    return 1
  }
}

# The guest user logs in from 127.0.0.1 only, which is where the tests are.
babel_idem_rabbitmq_answers() { rabbitmqctl -q await_startup --timeout 2 >/dev/null 2>&1; }

babel_idem_servers_rabbitmq() {
  if ! babel_idem_rabbitmq_answers; then
    babel_idem_servers_say "starting rabbitmq-server on 127.0.0.1:5672"
    rabbitmq-server -detached >/dev/null 2>&1 || return 1
  fi
  # A cold start takes a few seconds (the Erlang VM, then the node's apps).
  local tries=0
  until babel_idem_rabbitmq_answers; do
    tries=$((tries + 1))
    [ "$tries" -ge 60 ] && {
      babel_idem_servers_say "rabbitmq-server does not answer; its logs: /var/log/rabbitmq/"
      return 1
    }
    sleep 1
  done
  export BABEL_IDEM_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/%2f"
}

# tansu, an Apache-Kafka-protocol broker, pinned; built once from crates.io into /usr/local
# (about 20 minutes on 2 cores) and reused wherever it is on the PATH. Memory storage: a
# restart empties it, and every test makes topics of its own.
BABEL_IDEM_TANSU_VERSION=0.6.0
BABEL_IDEM_KAFKA_PORT=9092

babel_idem_kafka_answers() {
  tansu topic list --broker "tcp://127.0.0.1:$BABEL_IDEM_KAFKA_PORT" >/dev/null 2>&1
}

babel_idem_servers_kafka() {
  if ! command -v tansu >/dev/null 2>&1; then
    babel_idem_servers_say "installing tansu $BABEL_IDEM_TANSU_VERSION (cargo install, once)"
    cargo install --quiet --locked tansu --version "$BABEL_IDEM_TANSU_VERSION" \
      --features dynostore --root /usr/local || return 1
  fi
  if ! babel_idem_kafka_answers; then
    babel_idem_servers_say "starting tansu on 127.0.0.1:$BABEL_IDEM_KAFKA_PORT (memory storage)"
    mkdir -p /var/log/tansu
    setsid nohup tansu broker \
      --listener-url "tcp://127.0.0.1:$BABEL_IDEM_KAFKA_PORT" \
      --advertised-listener-url "tcp://127.0.0.1:$BABEL_IDEM_KAFKA_PORT" \
      --storage-engine memory://tansu/ >/var/log/tansu/tansu.log 2>&1 </dev/null &
  fi
  babel_idem_servers_wait babel_idem_kafka_answers || {
    babel_idem_servers_say "tansu does not answer; its log: /var/log/tansu/tansu.log"
    return 1
  }
  export BABEL_IDEM_KAFKA_URL="kafka://127.0.0.1:$BABEL_IDEM_KAFKA_PORT"
}

babel_idem_servers() {
  babel_idem_servers_install || { babel_idem_servers_say "could not install the servers"; return 1; }
  babel_idem_servers_redis || return 1
  babel_idem_servers_redis_cluster || return 1
  babel_idem_servers_postgres || return 1
  babel_idem_servers_rabbitmq || return 1
  babel_idem_servers_kafka || return 1
  export BABEL_IDEM_REQUIRE_SERVERS=1
  babel_idem_servers_say "Redis at $BABEL_IDEM_REDIS_URL, Redis Cluster at $BABEL_IDEM_REDIS_CLUSTER_URL, PostgreSQL at ${BABEL_IDEM_POSTGRES_URL/:postgres@/:***@}, RabbitMQ at ${BABEL_IDEM_AMQP_URL/:guest@/:***@}, Kafka (tansu) at $BABEL_IDEM_KAFKA_URL"
}

babel_idem_servers
