#!/usr/bin/env bash
# cluster.sh: run a local three-replica lab cluster behind the front, without
# Docker, and show which stores hold when retries land on different replicas.
#
#   scripts/cluster.sh          build, start, compare every registered design,
#                               print the breakage matrix, stop everything
#   scripts/cluster.sh --keep   the same, then keep the cluster running until
#                               Ctrl-C (point scripts/walkthrough.sh or curl
#                               at the front), and leave its schema and Redis
#                               keys behind for a look
#
# Environment (defaults in brackets):
#   CLUSTER_PORTS     the three replicas' loopback ports [8701 8702 8703]
#                     (space- or comma-separated)
#   FRONT_PORT        the front's (lab proxy) port [8616]
#   DATABASE_URL      the shared ledger and postgres store
#                     [postgres://postgres@127.0.0.1:5432/test?sslmode=disable]
#   REDIS_URL         the redis store [redis://127.0.0.1:6379/0]
#   LAB_PG_SCHEMA     the lab's own PostgreSQL schema [idempotency_lab_cluster]
#   LAB_REDIS_PREFIX  prefix of the lab's Redis keys [idempotency-lab-cluster:]
#   LAB_ADMIN_TOKEN   sent to /reset-lab when set (and required by the replicas)
#   LAB_BIN           a built lab binary to run instead of building one [none]
#   CLUSTER_WAIT      seconds to wait for the cluster (and the Redis pair)
#                     to answer [60]
#   CLUSTER_REDIS_PAIR
#                     on: start a throwaway Redis primary and replica
#                     (redis-server and redis-cli) that every replica
#                     fails over in the matrix's failover row; off: no pair,
#                     that row stays n/a [on]
#   CLUSTER_REDIS_PAIR_PORTS
#                     the pair's loopback ports, primary then replica
#                     [two free ports, picked at start]
#   LAB_REDIS_PAIR_PRIMARY, LAB_REDIS_PAIR_REPLICA
#                     redis:// URLs of a running primary and its replica to
#                     give every replica instead of starting a pair [none]
#
# It touches only its schema and its Redis prefix, and drops both on exit
# (psql and redis-cli, when installed; --keep keeps them); the pair it starts
# keeps nothing on disk. Every process it starts is stopped on exit, on error
# and on Ctrl-C / SIGTERM; their logs are in a temp directory, shown (tail)
# when something fails.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

keep=0
for arg in "$@"; do
	case "$arg" in
	--keep) keep=1 ;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		echo "cluster.sh: unknown argument $arg (try --help)" >&2
		exit 2
		;;
	esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" # go build ./cmd/lab from the repository root, whatever the caller's cwd
IFS=', ' read -r -a ports <<<"${CLUSTER_PORTS:-8701 8702 8703}"
front_port="${FRONT_PORT:-8616}"
database_url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
redis_url="${REDIS_URL:-redis://127.0.0.1:6379/0}"
pg_schema="${LAB_PG_SCHEMA:-idempotency_lab_cluster}"
redis_prefix="${LAB_REDIS_PREFIX:-idempotency-lab-cluster:}"
admin_token="${LAB_ADMIN_TOKEN:-}"
wait_seconds="${CLUSTER_WAIT:-60}"
pair_mode="${CLUSTER_REDIS_PAIR:-on}"
IFS=', ' read -r -a pair_ports <<<"${CLUSTER_REDIS_PAIR_PORTS:-}"
pair_primary="${LAB_REDIS_PAIR_PRIMARY:-}"
pair_replica="${LAB_REDIS_PAIR_REPLICA:-}"
front="http://127.0.0.1:$front_port"

die() {
	echo "cluster.sh: $*" >&2
	exit 1
}

if [[ ${#ports[@]} -ne 3 ]]; then
	die "CLUSTER_PORTS must name 3 ports (got '${CLUSTER_PORTS:-}')"
fi
for p in "${ports[@]}" "$front_port"; do
	if ! [[ $p =~ ^[0-9]+$ ]] || ((p < 1 || p > 65535)); then
		die "invalid port '$p' (CLUSTER_PORTS / FRONT_PORT)"
	fi
done
case "$pair_mode" in
on | off) ;;
*) die "CLUSTER_REDIS_PAIR must be on or off (got '$pair_mode')" ;;
esac
if [[ ${#pair_ports[@]} -ne 0 && ${#pair_ports[@]} -ne 2 ]]; then
	die "CLUSTER_REDIS_PAIR_PORTS must name 2 ports (got '${CLUSTER_REDIS_PAIR_PORTS:-}')"
fi
for p in "${pair_ports[@]}"; do
	if ! [[ $p =~ ^[0-9]+$ ]] || ((p < 1 || p > 65535)); then
		die "invalid port '$p' (CLUSTER_REDIS_PAIR_PORTS)"
	fi
	for q in "${ports[@]}" "$front_port"; do
		((p != q)) || die "CLUSTER_REDIS_PAIR_PORTS and CLUSTER_PORTS / FRONT_PORT share port $p"
	done
done
if [[ ${#pair_ports[@]} -eq 2 && ${pair_ports[0]} == "${pair_ports[1]}" ]]; then
	die "CLUSTER_REDIS_PAIR_PORTS must name 2 different ports"
fi
if [[ -n $pair_primary && -z $pair_replica ]] || [[ -z $pair_primary && -n $pair_replica ]]; then
	die "give both LAB_REDIS_PAIR_PRIMARY and LAB_REDIS_PAIR_REPLICA, or neither"
fi
for tool in go curl python3; do
	command -v "$tool" >/dev/null || die "$tool is required but not installed"
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/lab-cluster.XXXXXX")"
pids=()      # the lab processes: replicas, then the front
pair_pids=() # the Redis pair this script started: primary, then replica
helpers=()   # long foreground commands run in the background so signals act at once
failed=0     # print the logs' tails on exit

# stop_pids PID...: SIGTERM, SIGKILL for those still there after 15 s, then
# reap them.
stop_pids() {
	local pid alive=() i
	(($# > 0)) || return 0
	kill -TERM "$@" 2>/dev/null
	for ((i = 0; i < 150; i++)); do
		alive=()
		for pid in "$@"; do
			kill -0 "$pid" 2>/dev/null && alive+=("$pid")
		done
		((${#alive[@]} == 0)) && break
		sleep 0.1
	done
	if ((${#alive[@]} > 0)); then
		echo "cluster.sh: processes ${alive[*]} ignored SIGTERM for 15s: sending SIGKILL" >&2
		kill -KILL "${alive[@]}" 2>/dev/null
	fi
	for pid in "$@"; do wait "$pid" 2>/dev/null; done
}

# stop_all terminates every process this script started (the lab's first,
# then the Redis pair they use), waits for them (bounded), removes the temp
# dir and checks that none of them is still alive.
stop_all() {
	local rc=$? pid alive=()
	trap - EXIT
	trap '' INT TERM # a second Ctrl-C must not cut the (bounded) cleanup short
	set +e
	for pid in "${helpers[@]}"; do kill -TERM "$pid" 2>/dev/null; done
	stop_pids "${pids[@]}"
	stop_pids "${pair_pids[@]}"
	for pid in "${helpers[@]}"; do wait "$pid" 2>/dev/null; done
	if ((stopping && holding)); then
		rc=0 # Ctrl-C is how --keep ends
	elif ((!stopping && (rc != 0 || failed))); then
		((rc == 0)) && rc=1
		local log
		for log in "$tmp"/*.log; do
			[[ -s $log ]] || continue
			echo "--- last lines of $(basename "$log") ---" >&2
			tail -n 25 "$log" >&2
		done
	fi
	rm -rf "$tmp"
	((keep)) || drop_data
	for pid in "${pids[@]}" "${pair_pids[@]}"; do
		kill -0 "$pid" 2>/dev/null && alive+=("$pid")
	done
	if ((${#alive[@]} > 0)); then
		echo "cluster.sh: FAILED to stop processes ${alive[*]}" >&2
		exit 1
	fi
	((${#pids[@]} > 0)) && echo "cluster stopped: ${#pids[@]} processes (${pids[*]}) are gone"
	((${#pair_pids[@]} > 0)) && echo "redis pair stopped: ${#pair_pids[@]} processes (${pair_pids[*]}) are gone"
	exit "$rc"
}
# drop_data deletes the cluster's own schema and Redis keys, and nothing else.
drop_data() {
	[[ -n ${pg_schema:-} ]] || return 0
	if command -v psql >/dev/null; then
		psql -q "$database_url" -c "DROP SCHEMA IF EXISTS \"$pg_schema\" CASCADE" >/dev/null 2>&1 &&
			echo "dropped schema $pg_schema" || echo "cluster.sh: could not drop schema $pg_schema" >&2
	else
		echo "cluster.sh: psql is not installed: schema $pg_schema stays" >&2
	fi
	if command -v redis-cli >/dev/null; then
		redis-cli -u "$redis_url" --scan --pattern "${redis_prefix}*" | xargs -r redis-cli -u "$redis_url" unlink >/dev/null &&
			echo "deleted the Redis keys under $redis_prefix" || echo "cluster.sh: could not delete the keys under $redis_prefix" >&2
	else
		echo "cluster.sh: redis-cli is not installed: keys under $redis_prefix stay" >&2
	fi
}
stopping=0 # set by Ctrl-C / SIGTERM: a requested stop, not a failure
holding=0  # set while --keep holds the cluster
trap stop_all EXIT
trap 'stopping=1; echo; echo "cluster.sh: interrupted, stopping" >&2; exit 130' INT
trap 'stopping=1; echo "cluster.sh: terminated, stopping" >&2; exit 143' TERM

# bg_wait runs a command in the background and waits for it, so that Ctrl-C
# or SIGTERM is handled at once instead of after the command ends.
bg_wait() {
	local pid rc=0
	"$@" &
	pid=$!
	helpers+=("$pid")
	wait "$pid" || rc=$?
	helpers=("${helpers[@]:0:${#helpers[@]}-1}") # this one was pushed last
	return "$rc"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

for p in "${ports[@]}" "$front_port"; do
	if port_busy "$p"; then
		die "port $p is already in use (stop what listens there, or set CLUSTER_PORTS / FRONT_PORT)"
	fi
done
for p in "${pair_ports[@]}"; do
	if port_busy "$p"; then
		die "port $p is already in use (stop what listens there, or set CLUSTER_REDIS_PAIR_PORTS)"
	fi
done

if [[ -n ${LAB_BIN:-} ]]; then
	cp "$LAB_BIN" "$tmp/lab" || die "LAB_BIN=$LAB_BIN: cannot copy it"
else
	echo "building lab into $tmp"
	bg_wait go build -o "$tmp/lab" ./cmd/lab || die "go build failed"
fi

# free_ports N PORT...: N loopback ports that were free a moment ago, none of
# them among the PORTs given (the cluster's, which are not bound yet).
free_ports() {
	python3 - "$@" <<'PY'
import socket, sys

n, taken = int(sys.argv[1]), set(map(int, sys.argv[2:]))
held, picked = [], []
while len(picked) < n:  # every socket stays bound until the end, so they differ
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
    if s.getsockname()[1] not in taken:
        picked.append(s.getsockname()[1])
print(*picked)
PY
}

# start_redis ROLE PORT [ARG...]: one throwaway redis-server on loopback,
# keeping nothing on disk, its log and directory in the temp dir.
start_redis() {
	local role=$1 port=$2
	shift 2
	mkdir -p "$tmp/redis-$role"
	redis-server --save "" --appendonly no --repl-diskless-sync-delay 0 --dir "$tmp/redis-$role" \
		--bind 127.0.0.1 --port "$port" --daemonize no "$@" >"$tmp/redis-$role.log" 2>&1 &
	pair_pids+=("$!")
}

# pair_ready reports whether both servers answer and the replica's link to
# the primary is up and in sync.
pair_ready() {
	local info
	[[ $(redis-cli -h 127.0.0.1 -p "${pair_ports[0]}" ping 2>/dev/null) == PONG ]] || return 1
	[[ $(redis-cli -h 127.0.0.1 -p "${pair_ports[1]}" ping 2>/dev/null) == PONG ]] || return 1
	info="$(redis-cli -h 127.0.0.1 -p "${pair_ports[1]}" info replication 2>/dev/null)" || return 1
	[[ $info == *master_link_status:up* && $info != *master_sync_in_progress:1* ]]
}

# The Redis pair of the failover row: every process must fail the same
# primary and replica over, so the script starts them and gives them to all.
if [[ -n $pair_primary ]]; then
	echo "redis pair: the one given in LAB_REDIS_PAIR_PRIMARY and LAB_REDIS_PAIR_REPLICA"
elif [[ $pair_mode == off ]]; then
	echo "the failover row stays n/a: CLUSTER_REDIS_PAIR=off"
elif ! command -v redis-server >/dev/null; then
	echo "the failover row stays n/a: install redis-server"
elif ! command -v redis-cli >/dev/null; then
	echo "the failover row stays n/a: install redis-cli (it comes with redis-server)"
else
	if ((${#pair_ports[@]} == 0)); then
		read -r -a pair_ports <<<"$(free_ports 2 "${ports[@]}" "$front_port")"
		((${#pair_ports[@]} == 2)) || die "could not find two free ports for the Redis pair"
	fi
	start_redis primary "${pair_ports[0]}"
	start_redis replica "${pair_ports[1]}" --replicaof 127.0.0.1 "${pair_ports[0]}"
	echo "redis pair pids: ${pair_pids[*]}"
	deadline=$((SECONDS + wait_seconds))
	until pair_ready; do
		for i in 0 1; do
			if ! kill -0 "${pair_pids[i]}" 2>/dev/null; then
				failed=1
				die "redis-server $( ((i == 0)) && echo primary || echo replica) (pid ${pair_pids[i]}, port ${pair_ports[i]}) exited during startup"
			fi
		done
		if ((SECONDS >= deadline)); then
			failed=1
			die "the Redis pair (ports ${pair_ports[*]}) did not answer and link within ${wait_seconds}s"
		fi
		sleep 0.1
	done
	pair_primary="redis://127.0.0.1:${pair_ports[0]}/0"
	pair_replica="redis://127.0.0.1:${pair_ports[1]}/0"
	echo "redis pair ready: primary 127.0.0.1:${pair_ports[0]}, replica 127.0.0.1:${pair_ports[1]} (linked)"
fi

urls=()
for p in "${ports[@]}"; do urls+=("http://127.0.0.1:$p"); done

for i in 0 1 2; do
	peers=()
	for j in 0 1 2; do ((j != i)) && peers+=("${urls[j]}"); done
	LAB_ADDR="127.0.0.1:${ports[i]}" \
		LAB_REPLICA="r$((i + 1))" \
		LAB_PEERS="$(
			IFS=,
			echo "${peers[*]}"
		)" \
		LAB_BASE_PATH="" \
		LAB_FAULTS=on \
		DATABASE_URL="$database_url" \
		REDIS_URL="$redis_url" \
		LAB_PG_SCHEMA="$pg_schema" \
		LAB_REDIS_PREFIX="$redis_prefix" \
		LAB_EMBEDDED_POSTGRES=off \
		LAB_EMBEDDED_REDIS=off \
		LAB_REDIS_PAIR_PRIMARY="$pair_primary" \
		LAB_REDIS_PAIR_REPLICA="$pair_replica" \
		"$tmp/lab" serve -pg-pool-size 10 >"$tmp/r$((i + 1)).log" 2>&1 &
	pids+=("$!")
done
LAB_ADDR="127.0.0.1:$front_port" \
	LAB_PROXY_TARGETS="$(
		IFS=,
		echo "${urls[*]}"
	)" \
	"$tmp/lab" proxy >"$tmp/front.log" 2>&1 &
pids+=("$!")
echo "cluster pids: ${pids[*]}"

# ready reports whether every replica answers /health as itself and the
# front has all three in its rotation.
ready() {
	local i body
	for i in 0 1 2; do
		body="$(curl -fsS -m 2 "${urls[i]}/health" 2>/dev/null)" || return 1
		[[ $body == *"\"replica\":\"r$((i + 1))\""* ]] || return 1
	done
	body="$(curl -fsS -m 2 "$front/front/status" 2>/dev/null)" || return 1
	python3 -c 'import json,sys; r=json.load(sys.stdin).get("replicas") or {}; sys.exit(0 if len(r)==3 and all(r.values()) else 1)' <<<"$body"
}

deadline=$((SECONDS + wait_seconds))
until ready; do
	for i in "${!pids[@]}"; do
		if ! kill -0 "${pids[i]}" 2>/dev/null; then
			failed=1
			die "process ${pids[i]} ($( ((i < 3)) && echo "replica r$((i + 1))" || echo front)) exited during startup"
		fi
	done
	if ((SECONDS >= deadline)); then
		failed=1
		die "the cluster did not answer within ${wait_seconds}s"
	fi
	sleep 0.2
done
echo "cluster ready: replicas ${urls[*]}, front $front (schema $pg_schema, redis prefix $redis_prefix)"

auth=()
[[ -n $admin_token ]] && auth=(-H "Authorization: Bearer $admin_token")
# call URL OUT: GET URL, save the body to OUT, fail unless it answered 200.
call() {
	local code
	code="$(curl -sS -m 60 -o "$2" -w '%{http_code}' "${@:3}" "$1")" || {
		failed=1
		die "request to $1 failed"
	}
	if [[ $code != 200 ]]; then
		failed=1
		echo "cluster.sh: $1 answered $code:" >&2
		cat "$2" >&2
		echo >&2
		exit 1
	fi
}

call "$front/reset-lab" "$tmp/reset.json" -X POST "${auth[@]}"
echo "lab reset through the front"

# The comparison runs every design the cluster registers, as its index lists
# them: unsafe through /charge-unsafe, the others through /charge-idempotent.
call "$front/" "$tmp/index.json" -H "Accept: application/json"
stamp="$(date +%s)-$$"
mapfile -t runs < <(python3 - "$tmp/index.json" "$front" "$stamp" <<'PY'
import json, sys
from urllib.parse import quote, urlencode

with open(sys.argv[1]) as f:
    index = json.load(f)
front, stamp = sys.argv[2], sys.argv[3]
for i, v in enumerate(index.get("variants") or []):
    if not v.get("available"):
        continue
    name = v["name"]
    query = {"key": f"cluster-{name}-{stamp}", "replicas": 3, "attempts": 9}
    if name == "unsafe":
        path = "/charge-unsafe"
    else:
        path, query = "/charge-idempotent", {"store": name, **query}
    print(f"{i}\t{front}{path}?{urlencode(query, quote_via=quote)}")  # redis+postgres: redis%2Bpostgres
PY
)
((${#runs[@]} > 0)) || die "the front's index ($front/) lists no available design"

echo
echo "9 concurrent retries of one charge, spread over 3 replicas, per design:"
for run in "${runs[@]}"; do
	call "${run#*$'\t'}" "$tmp/run-${run%%$'\t'*}.json"
done
python3 - "$tmp" <<'PY'
import json, os, sys

with open(os.path.join(sys.argv[1], "index.json")) as f:
    variants = json.load(f)["variants"]
rows = [("store", "attempts", "replicas", "charges_applied", "verdict", "explanation")]
for i, v in enumerate(variants):
    if not v.get("available"):
        how = v.get("how_to_enable") or "no reason given"
        rows.append((v["name"], "-", "-", "-", "n/a", "unavailable: " + how))
        continue
    with open(os.path.join(sys.argv[1], f"run-{i}.json")) as f:
        r = json.load(f)
    rows.append((v["name"], str(r["attempts"]), str(r["replicas"]), str(r["charges_applied"]),
                 r["verdict"], r.get("explanation", "")))
widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
for row in rows:
    print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
PY

echo
echo "breakage matrix (every store against every scenario, through the front):"
bg_wait "$tmp/lab" matrix -url "$front" -format table || {
	failed=1
	die "lab matrix failed"
}

if ((keep)); then
	echo
	echo "cluster running (--keep); Ctrl-C stops it"
	echo "  front:    $front"
	for i in 0 1 2; do echo "  replica:  r$((i + 1)) ${urls[i]}"; done
	if ((${#pair_pids[@]} > 0)); then
		echo "  redis pair: primary 127.0.0.1:${pair_ports[0]}, replica 127.0.0.1:${pair_ports[1]} (roles swap at each failover)"
	fi
	echo "  try:      scripts/walkthrough.sh $front"
	echo "  logs:     $tmp/*.log"
	holding=1
	set +e
	wait -n "${pids[@]}" "${pair_pids[@]}"
	rc=$?
	set -e
	holding=0 failed=1
	die "a cluster process (lab or Redis pair) exited on its own (status $rc)"
fi
