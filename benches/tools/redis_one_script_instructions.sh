#!/usr/bin/env bash
# Instructions a redis-server runs per call of paced's one Redis script (src/redis/quota.lua, as
# checked out) beside the two scripts it replaced (gcra.lua, one limit, and multi.lua, several,
# as of the commit given), counted by callgrind: Redis runs one script at a time, so this is
# what bounds the throughput of `benches/redis.rs` and `benches/redis_multi.rs`, without the
# ±30 % that CPU time moves by on a shared machine. The workload: 20,000 `EVALSHA`s piped on
# one connection, each a "try" of 1 token on one key under buckets that never bind (1 µs per
# token, burst 10^9): one limit as `RedisRateLimiter` sends it (gcra.lua before, quota.lua's
# one-bucket form after), one limit as `RedisRateLimiter<[u64; 1]>` sends it and two limits
# (multi.lua before, quota.lua's general form after). The first 3,000 calls, and the loading of
# the scripts, are left out.
#
# Needs redis-server, redis-cli, valgrind (callgrind_control) and python3.
#
# Run: bash benches/tools/redis_one_script_instructions.sh COMMIT
# (COMMIT: one that still has gcra.lua and multi.lua, such as 6f7c2ed)
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
trap 'redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
calls=20000

git show "$1:src/redis/gcra.lua" >"$work/gcra.lua"; [ -n "${GCRA_LUA:-}" ] && cp "$GCRA_LUA" "$work/gcra.lua"
git show "$1:src/redis/multi.lua" >"$work/multi.lua"
cp "${QUOTA_LUA:-src/redis/quota.lua}" "$work/quota.lua"

python3 - "$work" "$calls" <<'PY'
import sys, struct, hashlib
work, calls = sys.argv[1], int(sys.argv[2])
def resp(args):
    out = b'*%d\r\n' % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b'$%d\r\n%s\r\n' % (len(a), a)
    return out
sha = {n: hashlib.sha1(open(f'{work}/{n}.lua', 'rb').read()).hexdigest() for n in ('gcra', 'multi', 'quota')}
bucket = struct.pack('<ddddd', 0, 1, 1e9, 0, 1)
cases = {
    'gcra': ['EVALSHA', sha['gcra'], '1', 'one', 'try', struct.pack('<ddddd', 1, 1e9, 1, 1, 0)],
    'quota1': ['EVALSHA', sha['quota'], '1', 'one', 'try', bucket + b'\x01'],
    'multi1': ['EVALSHA', sha['multi'], '1', 'one-dim', 'try', bucket],
    'quotam1': ['EVALSHA', sha['quota'], '1', 'one-dim', 'try', bucket],
    'multi2': ['EVALSHA', sha['multi'], '1', 'two', 'try', bucket * 2],
    'quotam2': ['EVALSHA', sha['quota'], '1', 'two', 'try', bucket * 2],
}
for name, args in cases.items():
    call = resp(args)
    open(f'{work}/{name}.warm.resp', 'wb').write(call * 3000)
    open(f'{work}/{name}.run.resp', 'wb').write(call * calls)
PY

for case in ${CASES:-gcra quota1 multi1 quotam1 multi2 quotam2}; do
    rm -f "$work"/cg.out.*
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out.%p" \
        redis-server --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
    for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
    for script in gcra multi quota; do
        redis-cli -p "$port" -x SCRIPT LOAD <"$work/$script.lua" >/dev/null
    done
    redis-cli -p "$port" --pipe <"$work/$case.warm.resp" >/dev/null 2>&1
    callgrind_control -z >/dev/null 2>&1
    redis-cli -p "$port" --pipe <"$work/$case.run.resp" 2>&1 | grep -q "errors: 0, replies: $calls"
    callgrind_control -d >/dev/null 2>&1
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait
    total=$(grep -h '^summary:' "$work"/cg.out.*.1 | awk '{print $2}')
    case $case in
        gcra) label="gcra.lua (before), one limit" ;;
        quota1) label="quota.lua (after), one limit, one-bucket form" ;;
        multi1) label="multi.lua (before), [u64; 1]" ;;
        quotam1) label="quota.lua (after), [u64; 1], general form" ;;
        multi2) label="multi.lua (before), two limits" ;;
        quotam2) label="quota.lua (after), two limits" ;;
    esac
    echo "$label: $((total / calls)) instructions per call"
done
