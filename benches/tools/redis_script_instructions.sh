#!/usr/bin/env bash
# Instructions a redis-server runs per call of a rate limiter's Lua script, counted by callgrind:
# a stable measure of a script's cost on Redis, where CPU time on a shared machine moves by
# ±30 % from run to run. Compares paced's one-limit grant (src/redis/quota.lua, as checked out;
# or the script of the commit given as $1: quota.lua, or gcra.lua before it) with throttle-kit
# 2.1.2's, on the same workload: 20,000 `EVALSHA`s piped on one connection, each taking 1 token of one of 10,000 keys under a limit
# that never binds (every call a grant and a write). The first 3,000 calls, and the loading of
# the script, are left out.
#
# Needs redis-server, redis-cli, valgrind (callgrind_control), python3, and throttle-kit's
# source in Cargo's registry (a dependency of `paced-benches`: `cargo fetch` puts it there).
#
# Run: bash benches/tools/redis_script_instructions.sh [commit]
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
calls=20000

if [ -n "${1:-}" ]; then
    # quota.lua, or before it the one-limit gcra.lua.
    git show "$1:src/redis/quota.lua" >"$work/paced.lua" 2>/dev/null ||
        git show "$1:src/redis/gcra.lua" >"$work/paced.lua"
else
    cp src/redis/quota.lua "$work/paced.lua"
fi
tk=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/throttle-kit-2.1.2 | head -1)
python3 - "$tk/src/redis.rs" "$work/tk.lua" <<'PY'
import sys
src = open(sys.argv[1]).read()
start = src.index('const GCRA_SCRIPT: &str = r#"') + len('const GCRA_SCRIPT: &str = r#"')
open(sys.argv[2], 'w').write(src[start:src.index('"#;', start)])
PY

# The calls, as RESP: paced's script takes a mode and five little-endian doubles (interval
# 1,000 µs, burst 10^9, cost 1, want 1, back 0), or, before it did, the same as text with a
# second key for the key's own limit; throttle-kit's takes its emission interval in ms, burst,
# cost, the client's time in ms and a TTL.
python3 - "$work" "$calls" <<'PY'
import sys, struct, random, hashlib
work, calls = sys.argv[1], int(sys.argv[2])
def resp(args):
    out = b'*%d\r\n' % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b'$%d\r\n%s\r\n' % (len(a), a)
    return out
for name in ('paced', 'tk'):
    code = open(f'{work}/{name}.lua', 'rb').read()
    sha = hashlib.sha1(code).hexdigest()
    binary = b'struct.unpack' in code
    one = b'one-bucket form' in code
    random.seed(1)
    for part, n in (('warm', 3000), ('run', calls)):
        buf = bytearray()
        for _ in range(n):
            key = '{b:tenant-%d}' % random.randrange(10000)
            if name == 'tk':
                args = ['EVALSHA', sha, '1', key, '1', '1000000000', '1', '1764000000000', '100000']
            elif one:
                args = ['EVALSHA', sha, '1', key, 'try', struct.pack('<ddddd', 0, 1000, 1e9, 0, 1) + b'\x01']
            elif binary:
                args = ['EVALSHA', sha, '1', key, 'try', struct.pack('<ddddd', 1000, 1e9, 1, 1, 0)]
            else:
                args = ['EVALSHA', sha, '2', key, key + ':limit', '1000', '1000000000', '1', '1', '0', 'try', '']
            buf += resp(args)
        open(f'{work}/{name}.{part}.resp', 'wb').write(buf)
PY

for name in paced tk; do
    rm -f "$work"/cg.out.*
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out.%p" \
        redis-server --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
    for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
    redis-cli -p "$port" -x SCRIPT LOAD <"$work/$name.lua" >/dev/null
    redis-cli -p "$port" --pipe <"$work/$name.warm.resp" >/dev/null 2>&1
    callgrind_control -z >/dev/null 2>&1
    redis-cli -p "$port" --pipe <"$work/$name.run.resp" 2>&1 | grep -q "errors: 0, replies: $calls"
    callgrind_control -d >/dev/null 2>&1
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait
    total=$(grep -h '^summary:' "$work"/cg.out.*.1 | awk '{print $2}')
    echo "$name: $((total / calls)) instructions per call"
done
