#!/usr/bin/env bash
# walkthrough.sh: the workshop walkthrough, step by step with curl, against
# any running lab (one `lab serve`, a replica, or the front of
# scripts/cluster.sh --keep).
#
#   scripts/walkthrough.sh [BASE_URL]     default http://127.0.0.1:8616
#
# Each step prints the command it runs (copy it and try variations), then
# checks the answer; the script stops with a clear message at the first
# answer that is not what the workshop expects.
#
# Environment:
#   LAB_ADMIN_TOKEN    sent to /reset-lab as Authorization: Bearer when set
#   WALKTHROUGH_STORE  the idempotent store of the walkthrough: memory, or
#                      postgres when BASE_URL is a cluster front (memory keys
#                      live in one replica, and the front spreads calls)
#
# It resets the lab first: the lab routes use the default key order-4711,
# which persists between runs.
set -euo pipefail

case "${1:-}" in
-h | --help)
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
	exit 0
	;;
esac
if (($# > 1)); then
	echo "usage: walkthrough.sh [BASE_URL]" >&2
	exit 2
fi

base="${1:-http://127.0.0.1:8616}"
base="${base%/}"
admin_token="${LAB_ADMIN_TOKEN:-}"
stamp="$(date +%s)-$$"
token="demo-token-acme"

for tool in curl python3; do
	command -v "$tool" >/dev/null || {
		echo "walkthrough.sh: $tool is required but not installed" >&2
		exit 1
	}
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/lab-walkthrough.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
body="$tmp/body"
hdrs="$tmp/headers"

step=0
front=0
store=""
title() {
	step=$((step + 1))
	printf '\n== %d. %s\n' "$step" "$*"
}

fail() {
	echo >&2
	echo "walkthrough.sh: FAILED at step $step: $*" >&2
	if [[ -s $body ]]; then
		echo "the answer was:" >&2
		cat "$body" >&2
		echo >&2
	fi
	if ((front)) && [[ $store == memory ]]; then
		echo "(expected behind a cluster front: the memory store keeps keys per replica, and this call landed on another one)" >&2
	fi
	exit 1
}

ok() { echo "   ok: $*"; }

# show prints a command so that it can be pasted into a shell; the admin
# token is shown as $LAB_ADMIN_TOKEN, never in clear.
show() {
	local out="$" arg
	for arg in "$@"; do
		if [[ -n $admin_token && $arg == *"$admin_token"* ]]; then
			arg="${arg//"$admin_token"/\$LAB_ADMIN_TOKEN}"
			out+=" \"$arg\""
		elif [[ $arg =~ ^[A-Za-z0-9_./:=@,+-]+$ ]]; then
			out+=" $arg"
		else
			out+=" '${arg//\'/\'\\\'\'}'"
		fi
	done
	echo "$out"
}

# req CURL_ARGS...: show the command, run it, keep the body and headers;
# sets status.
status=""
req() {
	show curl -sS "$@"
	: >"$body"
	: >"$hdrs"
	status="$(curl -sS -m 120 -o "$body" -D "$hdrs" -w '%{http_code}' "$@")" ||
		fail "curl could not reach $base: is the lab running? (lab serve, or scripts/cluster.sh --keep)"
	read_fields
}

# read_fields reads every field of the last answer once (one python3 per
# answer, not per field: its start-up is most of a step's time), as
# NUL-separated pairs of a path (dots separate nested names) and a value;
# the answer itself is the empty path, absent when it is not JSON.
fields="$tmp/fields"
read_fields() {
	python3 - "$body" >"$fields" <<'PY'
import json, sys
try:
    answer = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit(0)
def put(path, v):
    if isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, (dict, list)):
        text = json.dumps(v)
    else:
        text = str(v)
    sys.stdout.write(path + "\0" + text + "\0")
    if isinstance(v, dict):
        for k, x in v.items():
            put(path + "." + k if path else k, x)
put("", answer)
PY
}

# jget PATH: a field of the last answer, or <missing>.
jget() {
	local path value json=""
	while IFS= read -r -d '' path && IFS= read -r -d '' value; do
		[[ -n $path ]] || json=1
		if [[ $path == "$1" ]]; then
			printf '%s\n' "$value"
			return
		fi
	done <"$fields"
	[[ -n $json ]] || {
		echo "the answer is not JSON" >&2
		return 1
	}
	echo "<missing>"
}

# header NAME: a header of the last answer.
header() {
	awk -v name="$1" 'BEGIN { name = tolower(name) ":" }
		tolower($1) == name { sub(/^[^:]*: */, ""); sub(/\r$/, ""); print; exit }' "$hdrs"
}

expect_status() {
	[[ $status == "$1" ]] || fail "expected HTTP $1, got $status"
	ok "HTTP $status"
}

# expect PATH WANT: a field of the last answer must equal WANT.
expect() {
	local got
	got="$(jget "$1")"
	[[ $got == "$2" ]] || fail "expected $1 = $2, got $got"
	ok "$1 = $got"
}

# Behind the cluster's front, calls are spread over the replicas: memory keys
# live in one replica's heap, so a repeated call may find another replica that
# never saw the key. Walk through with a store they all share.
if curl -fsS -m 5 -o "$body" "$base/front/status" 2>/dev/null && read_fields && [[ $(jget replicas) != "<missing>" ]]; then
	front=1
fi
: >"$body"
: >"$fields"
store="${WALKTHROUGH_STORE:-}"
if [[ -z $store ]]; then
	store=memory
	if ((front)); then
		store=postgres
		echo "$base is a cluster front: walking through with store=postgres, which every replica shares"
		echo "(with store=memory each replica keeps its own keys; WALKTHROUGH_STORE=memory $0 $base shows it break)"
	fi
fi
case "$store" in
memory | redis | postgres) ;;
*) fail "WALKTHROUGH_STORE must be memory, redis or postgres (got $store)" ;;
esac
echo "lab: $base, idempotent store: $store"

title "Reset the lab (keys, ledger, outbox; the default key order-4711 persists otherwise)"
if [[ -n $admin_token ]]; then
	req -X POST "$base/reset-lab" -H "Authorization: Bearer $admin_token"
else
	req -X POST "$base/reset-lab"
fi
[[ $status != 401 ]] || fail "/reset-lab needs the admin token: set LAB_ADMIN_TOKEN"
expect_status 200
expect reset true

title "Without idempotency: 5 retries of one charge are 5 charges"
req "$base/charge-unsafe?attempts=5"
expect_status 200
expect charges_applied 5
expect overcharged_cents 10000
expect verdict breaks
echo "   why: $(jget explanation)"

title "With an idempotency key ($store store): 5 retries, 1 charge"
req "$base/charge-idempotent?store=$store&attempts=5"
expect_status 200
expect charges_applied 1
expect duplicates_prevented 4
expect verdict holds
echo "   why: $(jget explanation)"

title "The same call again: the key is known, every attempt replays, nothing is charged"
req "$base/charge-idempotent?store=$store&attempts=5"
expect_status 200
expect charges_applied 0
expect duplicates_prevented 5
expect idempotency_hits 5

key="walkthrough-$stamp"
charge='{"account":"acct-1","amount_cents":2500,"currency":"USD"}'
other='{"account":"acct-1","amount_cents":9900,"currency":"USD"}'

title "The real API: POST /charges with an Idempotency-Key charges once"
req -X POST "$base/charges?store=$store" -H "Authorization: Bearer $token" -H "Idempotency-Key: $key" -H 'Content-Type: application/json' -d "$charge"
expect_status 201
first="$(cat "$body")"
echo "   answer: $first"

title "The same request again (a client retry): the stored response is replayed"
req -X POST "$base/charges?store=$store" -H "Authorization: Bearer $token" -H "Idempotency-Key: $key" -H 'Content-Type: application/json' -d "$charge"
expect_status 201
[[ $(header Idempotent-Replayed) == true ]] || fail "expected the header Idempotent-Replayed: true, got '$(header Idempotent-Replayed)'"
ok "Idempotent-Replayed: true"
[[ $(cat "$body") == "$first" ]] || fail "the replay differs from the first answer: $first"
ok "same body as the first answer"

title "The same key with another amount: refused, the key belongs to the first request"
req -X POST "$base/charges?store=$store" -H "Authorization: Bearer $token" -H "Idempotency-Key: $key" -H 'Content-Type: application/json' -d "$other"
expect_status 422
expect code idempotency_key_reused

title "No Idempotency-Key: refused before anything is charged"
req -X POST "$base/charges?store=$store" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d "$charge"
expect_status 400
expect code idempotency_key_missing

title "Bad input on a lab route: 400, and the problem names the parameter"
req "$base/charge-idempotent?store=$store&amount=abc"
expect_status 400
[[ $(header Content-Type) == application/problem+json* ]] || fail "expected Content-Type application/problem+json, got '$(header Content-Type)'"
ok "Content-Type: application/problem+json"
expect param amount
echo "   detail: $(jget detail)"

# skip_unless_ran: the breakage steps need a store or faults the lab may not
# have; say so and move on rather than fail.
skip_unless_ran() {
	case "$status" in
	503) echo "   skipped: $(jget detail)"; return 1 ;;
	403) echo "   skipped: fault injection is off on this lab (-faults on enables it)"; return 1 ;;
	esac
	return 0
}

title "Where memory breaks: 9 retries over 3 replicas, one map per replica"
req "$base/charge-idempotent?store=memory&replicas=3&attempts=9&key=scale-$stamp"
expect_status 200
expect charges_applied 3
expect verdict breaks
echo "   why: $(jget explanation)"

title "Where redis breaks: the claim's TTL (100 ms) is shorter than the work (300 ms)"
req "$base/charge-idempotent?store=redis&fault=slow&work_ms=300&ttl_ms=100&key=ttl-$stamp"
if skip_unless_ran; then
	expect_status 200
	expect verdict breaks
	(($(jget charges_applied) > 1)) || fail "expected more than one charge, got $(jget charges_applied)"
	ok "charges_applied = $(jget charges_applied)"
	echo "   why: $(jget explanation)"
fi

title "Where postgres holds: the response is lost after the commit, the retries replay it"
req "$base/charge-idempotent?store=postgres&fault=crash_after_charge&key=lost-$stamp"
if skip_unless_ran; then
	expect_status 200
	expect charges_applied 1
	expect verdict holds
	echo "   why: $(jget explanation)"
fi

title "The outbox: each idempotent charge commits a receipt event, the relay delivers it (unsafe sends receipts directly)"
req "$base/outbox?limit=5"
expect_status 200
for f in outbox_pending outbox_delivered receipts duplicate_deliveries; do
	echo "   $f = $(jget "$f")"
done

title "Diagnostics: the ledger and what each store charged"
req "$base/diagnostics/summary"
expect_status 200
echo "   replica = $(jget replica), ledger = $(jget ledger)"
python3 - "$body" <<'PY'
import json, sys
for s in json.load(open(sys.argv[1])).get("stores") or []:
    print("   {store:<9} charges_applied={charges_applied} duplicates_applied={duplicates_applied} overcharged_cents={overcharged_cents}".format(**s))
PY

printf '\nwalkthrough passed: %d steps against %s\n' "$step" "$base"
