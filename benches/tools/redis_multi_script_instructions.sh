#!/usr/bin/env bash
# Instructions a redis-server runs per call of the several-limit script (src/redis/multi.lua)
# beside the one-limit script (src/redis/gcra.lua), counted by callgrind: Redis runs one script
# at a time, so this is what bounds the throughput of `benches/redis_multi.rs`, without the
# ±30 % that CPU time moves by on a shared machine. The workload of that benchmark: 20,000
# `EVALSHA`s piped on one connection, each a "try" of 1 token on one key under buckets that never
# bind (1 µs per token, burst 10^9): gcra.lua's one limit, multi.lua's one limit and its two.
# The first 3,000 calls, and the loading of the scripts, are left out.
#
# Needs redis-server, redis-cli, valgrind (callgrind_control) and python3.
#
# Run: bash benches/tools/redis_multi_script_instructions.sh [commit]
# (with a commit: both scripts as of that commit; without: as checked out)
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
trap 'redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
calls=20000

for script in gcra multi; do
    if [ -n "${1:-}" ]; then
        git show "$1:src/redis/$script.lua" >"$work/$script.lua"
    else
        cp "src/redis/$script.lua" "$work/$script.lua"
    fi
done

# The calls, as RESP: gcra.lua takes a mode and five doubles (interval, burst, cost, want,
# back); multi.lua a mode and five doubles per limit (kind 0 for a bucket, interval, burst, 0,
# cost).
python3 - "$work" "$calls" <<'PY'
import sys, struct, hashlib
work, calls = sys.argv[1], int(sys.argv[2])
def resp(args):
    out = b'*%d\r\n' % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b'$%d\r\n%s\r\n' % (len(a), a)
    return out
sha = {name: hashlib.sha1(open(f'{work}/{name}.lua', 'rb').read()).hexdigest() for name in ('gcra', 'multi')}
bucket = struct.pack('<ddddd', 0, 1, 1e9, 0, 1)
cases = {
    'gcra': ['EVALSHA', sha['gcra'], '1', 'one', 'try', struct.pack('<ddddd', 1, 1e9, 1, 1, 0)],
    'multi1': ['EVALSHA', sha['multi'], '1', 'one-dim', 'try', bucket],
    'multi2': ['EVALSHA', sha['multi'], '1', 'two', 'try', bucket * 2],
}
for name, args in cases.items():
    call = resp(args)
    open(f'{work}/{name}.warm.resp', 'wb').write(call * 3000)
    open(f'{work}/{name}.run.resp', 'wb').write(call * calls)
PY

for case in gcra multi1 multi2; do
    rm -f "$work"/cg.out.*
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out.%p" \
        redis-server --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
    for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
    redis-cli -p "$port" -x SCRIPT LOAD <"$work/gcra.lua" >/dev/null
    redis-cli -p "$port" -x SCRIPT LOAD <"$work/multi.lua" >/dev/null
    redis-cli -p "$port" --pipe <"$work/$case.warm.resp" >/dev/null 2>&1
    callgrind_control -z >/dev/null 2>&1
    redis-cli -p "$port" --pipe <"$work/$case.run.resp" 2>&1 | grep -q "errors: 0, replies: $calls"
    callgrind_control -d >/dev/null 2>&1
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait
    total=$(grep -h '^summary:' "$work"/cg.out.*.1 | awk '{print $2}')
    case $case in
        gcra) label="gcra.lua, one limit" ;;
        multi1) label="multi.lua, one limit" ;;
        multi2) label="multi.lua, two limits" ;;
    esac
    echo "$label: $((total / calls)) instructions per call"
done
