#!/usr/bin/env bash
# A local pyshuffle external shuffle cluster on 127.0.0.1, for development and tests: one
# coordinator and N workers, each a background `pyshuffle daemon` process with its own role.
#
#   deploy/local-cluster.sh start [N]   coordinator on port 19097, N workers (default 2) on
#                                       19100..19100+N-1 (data ports 19300+i); metrics on
#                                       19099 and 19200+i
#   deploy/local-cluster.sh status      list the daemons, their ports and state
#   deploy/local-cluster.sh stop        SIGTERM every daemon, SIGKILL what is left after a timeout
#
# Everything lives in the run directory: each daemon's config (NAME.toml), log (NAME.log) and
# pid file (NAME.pid), the token (mode 600), each worker's store (store/worker-I) and
# client.toml, the settings clients use.
#
# Environment:
#   PYSHUFFLE                    the pyshuffle command (default: pyshuffle on the PATH, else
#                                this checkout's .venv/bin/pyshuffle)
#   PYSHUFFLE_CLUSTER_DIR        the run directory (default: .pyshuffle-cluster in the current
#                                directory). Set it for the command only
#                                (PYSHUFFLE_CLUSTER_DIR=/tmp/c deploy/local-cluster.sh start),
#                                not exported: pyshuffle reports a PYSHUFFLE_* variable that is
#                                no option as a config error.
#   LOCAL_CLUSTER_START_TIMEOUT  seconds to wait for every port to accept connections (60)
#   LOCAL_CLUSTER_STOP_TIMEOUT   seconds to wait after SIGTERM before SIGKILL (20)
set -euo pipefail
shopt -s nullglob

readonly COORDINATOR_PORT=19097
readonly COORDINATOR_METRICS_PORT=19099
readonly WORKER_BASE_PORT=19100
readonly WORKER_METRICS_BASE_PORT=19200
readonly WORKER_DATA_BASE_PORT=19300
readonly MAX_WORKERS=100
# Local daemons need not wait long for in-flight streams when stopped.
readonly SHUTDOWN_GRACE=5
readonly FACTORY=external_shuffle.ExternalShuffleServiceFactory

# pyshuffle on the PATH, else the one `make demo` / `make setup` installed in this checkout.
CHECKOUT_PYSHUFFLE="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/pyshuffle"
PYSHUFFLE_COMMAND=${PYSHUFFLE:-$(command -v pyshuffle || echo "$CHECKOUT_PYSHUFFLE")}
RUN_DIR=${PYSHUFFLE_CLUSTER_DIR:-.pyshuffle-cluster}
START_TIMEOUT=${LOCAL_CLUSTER_START_TIMEOUT:-60}
STOP_TIMEOUT=${LOCAL_CLUSTER_STOP_TIMEOUT:-20}
# Not passed on to the daemons: it is no pyshuffle option.
unset PYSHUFFLE_CLUSTER_DIR

usage() {
    cat <<EOF
usage: $0 start [N]   start a coordinator and N workers (default 2) on 127.0.0.1
       $0 status      list the daemons
       $0 stop        stop every daemon
run directory: $RUN_DIR (PYSHUFFLE_CLUSTER_DIR); command: $PYSHUFFLE_COMMAND (PYSHUFFLE)
EOF
}

say() {
    printf 'local-cluster: %s\n' "$*"
}

die() {
    printf 'local-cluster: error: %s\n' "$*" >&2
    exit 1
}

# cluster_command ACTION: the command line for ACTION on this run directory, which it names:
# without it the script would look in the default one, relative to where it is run.
cluster_command() {
    printf 'PYSHUFFLE_CLUSTER_DIR=%q %q %s' "$RUN_DIR" "$0" "$1"
}

is_count() {
    [[ $1 =~ ^[0-9]+$ ]]
}

# The daemons recorded in the run directory (by pid file): coordinator first, workers by index.
recorded_names() {
    local pid_file
    if [[ -f $RUN_DIR/coordinator.pid ]]; then
        echo coordinator
    fi
    for pid_file in "$RUN_DIR"/worker-*.pid; do
        basename "$pid_file" .pid
    done | sort -t- -k2,2n
}

grpc_port() {
    if [[ $1 == coordinator ]]; then
        echo "$COORDINATOR_PORT"
    else
        echo "$((WORKER_BASE_PORT + ${1#worker-}))"
    fi
}

metrics_port() {
    if [[ $1 == coordinator ]]; then
        echo "$COORDINATOR_METRICS_PORT"
    else
        echo "$((WORKER_METRICS_BASE_PORT + ${1#worker-}))"
    fi
}

read_pid() {
    local pid=""
    if [[ -f $RUN_DIR/$1.pid ]]; then
        pid=$(<"$RUN_DIR/$1.pid")
    fi
    if is_count "$pid"; then
        echo "$pid"
    fi
}

# Whether PID is alive and still one of our daemons (not a recycled pid of another program).
is_daemon() {
    local pid=$1 args
    if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then
        return 1
    fi
    # -ww: the whole command line, not as much as an exported COLUMNS lets through.
    if args=$(ps -ww -o args= -p "$pid" 2>/dev/null); then
        [[ $args == *"daemon --role"* ]]
    else
        return 0 # no ps here: trust the pid file
    fi
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# workers_alive: how many workers the coordinator counts as alive (its metrics endpoint, read
# with bash alone); 0 when it cannot be read yet.
workers_alive() {
    local line count=0
    if exec 3<>"/dev/tcp/127.0.0.1/$COORDINATOR_METRICS_PORT"; then
        printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
        while IFS= read -r line <&3; do
            if [[ $line == "pyshuffle_workers_alive "* ]]; then
                count=${line#* }
                count=${count%%.*}
            fi
        done
        exec 3<&-
    fi 2>/dev/null
    echo "$count"
}

toml_string() {
    local text=${1//\\/\\\\}
    printf '"%s"' "${text//\"/\\\"}"
}

# write_config NAME: the TOML of one daemon (worker-I also gets its port and store).
write_config() {
    local name=$1
    {
        printf '# Written by deploy/local-cluster.sh for %s; rewritten at every start.\n' "$name"
        printf '[external-shuffle.coordinator]\naddress = "127.0.0.1:%s"\n\n' "$COORDINATOR_PORT"
        printf '[external-shuffle.auth]\ntoken-file = %s\n\n' "$(toml_string "$RUN_DIR/token")"
        printf '[external-shuffle.daemon]\nbind-host = "127.0.0.1"\nmetrics-port = %s\n' \
            "$(metrics_port "$name")"
        printf 'shutdown-grace = %s\nlog-format = "text"\n' "$SHUTDOWN_GRACE"
        if [[ $name == worker-* ]]; then
            printf '\n[external-shuffle.worker]\nport = %s\nadvertised-host = "127.0.0.1"\n' \
                "$(grpc_port "$name")"
            printf 'data-port = %s\n' "$((WORKER_DATA_BASE_PORT + ${name#worker-}))"
            printf 'store-url = %s\n' "$(toml_string "$RUN_DIR/store/$name")"
        fi
    } >"$RUN_DIR/$name.toml"
}

write_client_config() {
    {
        printf '# Client settings of the local cluster (deploy/local-cluster.sh).\n'
        printf 'shuffle-service-factory.class = "%s"\n\n' "$FACTORY"
        printf '[external-shuffle.coordinator]\naddress = "127.0.0.1:%s"\n\n' "$COORDINATOR_PORT"
        printf '[external-shuffle.auth]\ntoken-file = %s\n' "$(toml_string "$RUN_DIR/token")"
    } >"$RUN_DIR/client.toml"
}

# launch NAME ROLE: start one daemon in the background, detached from this shell.
launch() {
    local name=$1 role=$2
    nohup "$PYSHUFFLE_COMMAND" daemon --role "$role" --config "$RUN_DIR/$name.toml" \
        >"$RUN_DIR/$name.log" 2>&1 </dev/null &
    echo "$!" >"$RUN_DIR/$name.pid"
}

# stop_all: SIGTERM every recorded daemon, wait for them, SIGKILL the ones left; remove pid files.
stop_all() {
    local name pid deadline stopped
    local -a names=() waiting=() still=()
    while read -r name; do
        names+=("$name")
    done < <(recorded_names)
    for name in "${names[@]+"${names[@]}"}"; do
        pid=$(read_pid "$name")
        if is_daemon "$pid"; then
            kill -TERM "$pid" 2>/dev/null || true
            waiting+=("$name")
        else
            say "$name was not running"
        fi
    done
    stopped=${#waiting[@]}
    deadline=$((SECONDS + STOP_TIMEOUT))
    while ((${#waiting[@]} > 0 && SECONDS <= deadline)); do
        still=()
        for name in "${waiting[@]}"; do
            if is_daemon "$(read_pid "$name")"; then
                still+=("$name")
            fi
        done
        waiting=("${still[@]+"${still[@]}"}")
        if ((${#waiting[@]} > 0)); then
            sleep 0.2
        fi
    done
    for name in "${waiting[@]+"${waiting[@]}"}"; do
        pid=$(read_pid "$name")
        printf 'local-cluster: %s (pid %s) still running %ss after SIGTERM: sending SIGKILL\n' \
            "$name" "$pid" "$STOP_TIMEOUT" >&2
        kill -KILL "$pid" 2>/dev/null || true
    done
    for name in "${names[@]+"${names[@]}"}"; do
        rm -f "$RUN_DIR/$name.pid"
    done
    say "stopped ${stopped} daemon(s)"
}

# fail_start NAME MESSAGE: show NAME's log tail, stop what was started, exit 1.
fail_start() {
    local name=$1 message=$2
    {
        printf 'local-cluster: error: %s\n' "$message"
        printf 'local-cluster: last lines of %s:\n' "$RUN_DIR/$name.log"
        tail -n 20 "$RUN_DIR/$name.log" 2>/dev/null | sed 's/^/    /'
    } >&2
    trap - INT TERM
    stop_all >&2
    exit 1
}

cmd_start() {
    local workers=${1:-2} name pid port deadline i
    if ! is_count "$workers" || ((workers < 1 || workers > MAX_WORKERS)); then
        die "N must be a number of workers from 1 to $MAX_WORKERS, not '$workers'"
    fi
    if ! is_count "$START_TIMEOUT" || ! is_count "$STOP_TIMEOUT"; then
        die "LOCAL_CLUSTER_START_TIMEOUT and LOCAL_CLUSTER_STOP_TIMEOUT are whole seconds"
    fi
    command -v "$PYSHUFFLE_COMMAND" >/dev/null 2>&1 \
        || die "command not found: $PYSHUFFLE_COMMAND (install pyshuffle's wheel with its external extra: README.md's Install; or set PYSHUFFLE)"
    (umask 077 && mkdir -p "$RUN_DIR")
    RUN_DIR=$(cd "$RUN_DIR" && pwd)

    local -a names=(coordinator)
    for ((i = 0; i < workers; i++)); do
        names+=("worker-$i")
    done
    while read -r name; do
        if is_daemon "$(read_pid "$name")"; then
            die "$name is already running (see '$(cluster_command status)'); run '$(cluster_command stop)' first"
        fi
        rm -f "$RUN_DIR/$name.pid"
    done < <(recorded_names)
    for name in "${names[@]}"; do
        for port in "$(grpc_port "$name")" "$(metrics_port "$name")"; do
            if port_open "$port"; then
                die "port $port on 127.0.0.1 ($name) is already in use by another program"
            fi
        done
    done

    if [[ ! -s $RUN_DIR/token ]]; then
        (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$RUN_DIR/token")
    fi
    chmod 600 "$RUN_DIR/token"
    for name in "${names[@]}"; do
        write_config "$name"
        if [[ $name == worker-* ]]; then
            mkdir -p "$RUN_DIR/store/$name"
        fi
    done
    write_client_config

    trap 'fail_start coordinator "interrupted"' INT TERM
    launch coordinator coordinator
    for ((i = 0; i < workers; i++)); do
        launch "worker-$i" worker
    done

    deadline=$((SECONDS + START_TIMEOUT))
    for name in "${names[@]}"; do
        pid=$(read_pid "$name")
        for port in "$(grpc_port "$name")" "$(metrics_port "$name")"; do
            until port_open "$port"; do
                if ! kill -0 "$pid" 2>/dev/null; then
                    fail_start "$name" "$name (pid $pid) exited before accepting connections on port $port"
                fi
                if ((SECONDS > deadline)); then
                    fail_start "$name" "$name (pid $pid) did not accept connections on port $port within ${START_TIMEOUT}s"
                fi
                sleep 0.2
            done
        done
    done
    # Ports open before workers register: wait until the coordinator can place partitions.
    until (($(workers_alive) >= workers)); do
        if ((SECONDS > deadline)); then
            fail_start coordinator "the coordinator did not see $workers worker(s) alive within ${START_TIMEOUT}s"
        fi
        sleep 0.2
    done
    trap - INT TERM

    cat <<EOF
pyshuffle local cluster up: a coordinator and $workers worker(s) on 127.0.0.1
  run directory: $RUN_DIR (logs NAME.log, pid files NAME.pid)

Client settings (also in $RUN_DIR/client.toml):
  shuffle-service-factory.class = "$FACTORY"
  external-shuffle.coordinator.address = "127.0.0.1:$COORDINATOR_PORT"
  external-shuffle.auth.token-file = "$RUN_DIR/token"
Spark:
  --conf spark.pyshuffle.shuffle-service-factory.class=$FACTORY
  --conf spark.pyshuffle.external-shuffle.coordinator.address=127.0.0.1:$COORDINATOR_PORT
  --conf spark.pyshuffle.external-shuffle.auth.token-file=$RUN_DIR/token
Stop it with: $(cluster_command stop)
EOF
}

cmd_stop() {
    if [[ ! -d $RUN_DIR ]]; then
        say "nothing to stop: no run directory $RUN_DIR"
        return 0
    fi
    stop_all
}

# Exit status: 0 every recorded daemon runs, 1 some do not, 3 none is recorded.
cmd_status() {
    local name pid state status=0
    local -a names=()
    if [[ -d $RUN_DIR ]]; then
        while read -r name; do
            names+=("$name")
        done < <(recorded_names)
    fi
    if ((${#names[@]} == 0)); then
        say "not running (no pid files in $RUN_DIR)"
        return 3
    fi
    printf '%-12s %-8s %-8s %-6s %-8s %s\n' NAME PID STATE PORT METRICS LOG
    for name in "${names[@]}"; do
        pid=$(read_pid "$name")
        if is_daemon "$pid"; then
            state=running
        else
            state=stopped
            status=1
        fi
        printf '%-12s %-8s %-8s %-6s %-8s %s\n' "$name" "${pid:--}" "$state" \
            "$(grpc_port "$name")" "$(metrics_port "$name")" "$RUN_DIR/$name.log"
    done
    return "$status"
}

case ${1:-} in
start)
    if (($# > 2)); then
        usage >&2
        exit 2
    fi
    cmd_start "${2:-2}"
    ;;
stop) cmd_stop ;;
status) cmd_status ;;
-h | --help | help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac
