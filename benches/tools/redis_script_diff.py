#!/usr/bin/env python3
# paced's one Redis script (src/redis/quota.lua), in its general form (one to three limits), as
# checked out against the same script at a
# commit, on the same random operations: every reply (errors with the key's name and the
# script's line taken out), every stored string, byte for byte, and every expiry must be equal.
# For a change meant to leave the script's behaviour as it was (a faster script, say).
#
# Both run on one private redis-server, each on keys of its own, with Redis's clock and expiry
# faked so that both see the same instants: `redis.call('TIME')` reads two keys, and a
# `SET … PX` writes the TTL beside the key instead; a key expires when the fake clock passes
# its TTL. The operations: one to three limits (buckets and fixed windows, one to three
# dimensions), "try" with and without a lease, "reserve" with and without a longest wait and a
# lease, "settle" (charges and refunds, with and without the grant's instant), "limit" (also of
# no such limit and of the other kind), "clear", a spec of another number of limits, and states
# that are not paced quotas (another version, a wrong length, NaN, an infinity, a fractional
# time). Time moves by 0 to 50 minutes between calls, and sometimes back.
#
# Needs redis-server and python3.
#
# Run: python3 benches/tools/redis_script_diff.py COMMIT [SEED [CASES]]
import atexit, os, random, re, socket, struct, subprocess, sys, time

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
commit = sys.argv[1]
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
cases = int(sys.argv[3]) if len(sys.argv) > 3 else 300
old_src = subprocess.run(['git', '-C', root, 'show', f'{commit}:src/redis/quota.lua'],
                         check=True, capture_output=True, text=True).stdout
new_src = open(os.path.join(root, 'src/redis/quota.lua')).read()

SHIM = """local real = redis
local redis = { error_reply = real.error_reply, call = function(cmd, key, ...)
  local args = { ... }
  if cmd == 'SET' then
    if args[2] == 'PX' then
      real.call('SET', 'ttl:' .. key, args[3])
    else
      real.call('DEL', 'ttl:' .. key)
    end
    return real.call('SET', key, args[1])
  end
  if cmd == 'TIME' then
    return { real.call('GET', 'fake:sec'), real.call('GET', 'fake:usec') }
  end
  return real.call(cmd, key, ...)
end }
"""

probe = socket.socket()
probe.bind(('127.0.0.1', 0))
port = probe.getsockname()[1]
probe.close()
server = subprocess.Popen(['redis-server', '--port', str(port), '--save', '', '--appendonly', 'no'],
                          stdout=subprocess.DEVNULL)
atexit.register(server.kill)
for _ in range(100):
    try:
        conn = socket.create_connection(('127.0.0.1', port))
        break
    except OSError:
        time.sleep(0.05)
replies = conn.makefile('rb')


def read():
    line = replies.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b'+':
        return rest.decode()
    if kind == b'-':
        return ('ERR', rest.decode())
    if kind == b':':
        return int(rest)
    if kind == b'$':
        n = int(rest)
        return None if n < 0 else replies.read(n + 2)[:-2]
    if kind == b'*':
        n = int(rest)
        return None if n < 0 else [read() for _ in range(n)]
    raise ValueError(line)


def cmd(*args):
    out = b'*%d\r\n' % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b'$%d\r\n%s\r\n' % (len(a), a)
    conn.sendall(out)
    return read()


def doubles(*v):
    return struct.pack('<' + 'd' * len(v), *v)


def error_text(reply, key):
    if isinstance(reply, tuple):
        return (reply[0], re.sub(r'script: \w+, on @user_script:\d+|user_script:\d+:', '', reply[1].replace(key, 'KEY')))
    return reply


sha_old, sha_new = cmd('SCRIPT', 'LOAD', SHIM + old_src), cmd('SCRIPT', 'LOAD', SHIM + new_src)
cmd('FLUSHALL')
rng = random.Random(seed)


def a_limit():
    if rng.random() < 0.6:
        x = rng.choice([1, 0.5, 0.001, 3.7, 1000, 1e6, 60e6 / 7, 2.5e9])
        return [0, x, rng.choice([1, 2, 3, 5, 10, 100, 1e9]), 0]
    x = rng.choice([1e6, 60e6, 1000, 3600e6, 7])
    z = rng.choice([0, 0, x / 3, x - 1]) if x > 7 else 0
    return [1, x, rng.choice([1, 3, 10, 1000]), float(int(z))]


mismatches = steps = 0
for case in range(cases):
    m = rng.choice([1, 1, 2, 2, 3])
    limits = [a_limit() for _ in range(m)]
    ndim = rng.randint(1, m)
    dims = [rng.randrange(ndim) for _ in range(m)]
    now = 1_700_000_000_000_000 + rng.randrange(10**12)
    old_key, new_key = '{o%d}' % case, '{n%d}' % case
    keys = (old_key, new_key, 'ttl:' + old_key, 'ttl:' + new_key)
    last_at = expire_at = None
    for step in range(rng.randint(5, 60)):
        r = rng.random()
        if r < 0.7:
            now += rng.choice([0, 0, 1, 10, 100, 1000, 12345, 10**6, 60 * 10**6, 3 * 10**9])
        elif r < 0.75:
            now -= rng.choice([1, 1000, 10**6])
        if expire_at is not None and now / 1000 >= expire_at:
            cmd('DEL', *keys)
            expire_at = None
        sec, usec = divmod(now, 10**6)
        cmd('SET', 'fake:sec', sec)
        cmd('SET', 'fake:usec', usec)
        lim = limits if rng.random() >= 0.02 else [a_limit() for _ in range(rng.choice([1, 2, 3]))]
        ops = ['try', 'reserve', 'settle', 'try_lease', 'reserve_lease']
        if rng.random() < 0.3:
            ops = ['try'] * 3 + ['try_lease'] + ['reserve'] * 2 + ['reserve_wait', 'reserve_lease'] + \
                ['settle'] * 2 + ['limit', 'clear', 'corrupt']
        op = rng.choice(ops)
        costs = [rng.choice([0, 1, 1, 1, 2, 3, 5, 7, 10, 50, 1000, 1e9 + 1]) for _ in range(ndim)]

        def spec(sign=1):
            return b''.join(doubles(*l, sign * costs[dims[i]] if i < m else 1) for i, l in enumerate(lim))
        lease = b''.join(doubles(dims[i] if i < m else 0, rng.choice([0, 1, 10, 100, 1e9]))
                         for i in range(len(lim)))
        # The lease's rule for a reservation: 1, wait for the whole lease; 0, take what is there.
        lease += doubles(rng.choice([0, 1]))
        if op == 'try':
            args = ['try', spec()]
        elif op == 'try_lease':
            args = ['try', spec(), b'', lease]
        elif op == 'reserve':
            args = ['reserve', spec()]
        elif op == 'reserve_wait':
            args = ['reserve', spec(), doubles(rng.choice([0, 1, 1000, 10**6, 10**9, 1.8e308]))]
        elif op == 'reserve_lease':
            args = ['reserve', spec(), doubles(rng.choice([0, 1000, 10**6, 10**9, 1.8e308])), lease]
        elif op == 'settle':
            args = ['settle', spec(rng.choice([1, -1, -1]))]
            if last_at is not None and rng.random() < 0.7:
                args.append(doubles(last_at))
        elif op == 'limit':
            i = rng.choice([1, 1, 2, 3, 0, len(lim) + 1, 1.5]) if rng.random() < 0.2 else rng.randint(1, len(lim))
            new = a_limit()
            if rng.random() < 0.7 and 1 <= i <= len(lim) and i == int(i):
                new[0] = lim[int(i) - 1][0]
            args = ['limit', spec(), doubles(i, *new)]
        elif op == 'clear':
            args = ['clear', spec()]
        else:
            bad = rng.choice([b'\x02' + b'\0' * 40, b'', b'\x01', b'\x01' + doubles(1.5, 1, 1),
                              b'\x01' + doubles(float('nan'), 1), b'\x01' + doubles(-5) + doubles(1, 1) * len(lim),
                              b'\x01' + doubles(float(now)) + doubles(float('inf'), 1) * len(lim),
                              b'\x01' + doubles(float(now)) + doubles(1, float('nan')) * len(lim)])
            cmd('SET', old_key, bad)
            cmd('SET', new_key, bad)
            cmd('DEL', keys[2], keys[3])
            expire_at = None
            continue
        old = error_text(cmd('EVALSHA', sha_old, 1, old_key, *args), old_key)
        new = error_text(cmd('EVALSHA', sha_new, 1, new_key, *args), new_key)
        steps += 1
        old_state, new_state = cmd('GET', old_key), cmd('GET', new_key)
        old_ttl, new_ttl = cmd('GET', keys[2]), cmd('GET', keys[3])
        expire_at = now / 1000 + int(old_ttl) if old_ttl is not None else None
        if (old, old_state, old_ttl) != (new, new_state, new_ttl):
            mismatches += 1
            if mismatches <= 10:
                print(f'case {case} step {step}: {op} with limits {lim}, costs {costs}, arguments {args}')
                print(f'  {commit}: {old} {old_state} ttl {old_ttl}')
                print(f'  checked out: {new} {new_state} ttl {new_ttl}')
        if isinstance(old, list) and old[0] == 1 and old[2]:
            last_at = float(old[2])
        if isinstance(new, tuple) and rng.random() < 0.5:
            # Not a quota any more: mostly start afresh.
            cmd('DEL', *keys)
            expire_at = None
print(f'seed {seed}: {steps} operations, {mismatches} mismatches')
sys.exit(1 if mismatches else 0)
