# shellcheck shell=bash
# Makes sure Redis, PostgreSQL, RabbitMQ (and faketime, for the clock-skew tests) are installed, running and
# answering, then exports what the store and transport tests read:
#   BABEL_IDEM_REDIS_URL, BABEL_IDEM_POSTGRES_URL, BABEL_IDEM_AMQP_URL,
#   BABEL_IDEM_REQUIRE_SERVERS=1
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

babel_idem_servers() {
  babel_idem_servers_install || { babel_idem_servers_say "could not install the servers"; return 1; }
  babel_idem_servers_redis || return 1
  babel_idem_servers_postgres || return 1
  babel_idem_servers_rabbitmq || return 1
  export BABEL_IDEM_REQUIRE_SERVERS=1
  babel_idem_servers_say "Redis at $BABEL_IDEM_REDIS_URL, PostgreSQL at ${BABEL_IDEM_POSTGRES_URL/:postgres@/:***@}, RabbitMQ at ${BABEL_IDEM_AMQP_URL/:guest@/:***@}"
}

babel_idem_servers
