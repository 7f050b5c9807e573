# shellcheck shell=bash
# Makes the Python peer (the BabelQueue Python SDK, pinned) available to the
# interop tests, in a virtualenv of this checkout's own:
#   BABEL_IDEM_PYTHON  the virtualenv's python, exported for the tests.
#
# Sourced by .ci/run: `source .ci/python.sh`. Installs python3-venv with
# apt-get where the machine lacks it. Returns non-zero (and says why) when the
# peer cannot be had.

# The SDK and the Redis, AMQP (pika, the `amqp` extra) and Kafka (confluent-kafka, the `kafka`
# extra) clients it drives, pinned: the interop tests compare bytes.
BABEL_IDEM_PYTHON_SDK=("babelqueue[redis,amqp,kafka]==1.24.0" "redis==8.1.0" "pika==1.4.4" "confluent-kafka==2.16.2")

babel_idem_python_say() { printf 'python peer: %s\n' "$*" >&2; }

babel_idem_python() {
  local root venv
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  venv="$root/target/python-peer"
  if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    babel_idem_python_say "installing python3 and python3-venv"
    apt-get update -qq || return 1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip >/dev/null || return 1
  fi
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || return 1
  fi
  if ! "$venv/bin/python" -m pip show -q babelqueue pika confluent-kafka >/dev/null 2>&1 \
    || [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("babelqueue"))')" != "1.24.0" ]; then
    babel_idem_python_say "installing ${BABEL_IDEM_PYTHON_SDK[*]} into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${BABEL_IDEM_PYTHON_SDK[@]}" || return 1
  fi
  export BABEL_IDEM_PYTHON="$venv/bin/python"
  babel_idem_python_say "$("$BABEL_IDEM_PYTHON" -c 'import importlib.metadata as m; print("babelqueue", m.version("babelqueue"))') at $BABEL_IDEM_PYTHON"
}

babel_idem_python
