-- paced's several limits in Redis (token buckets and aligned fixed windows), all checked and
-- charged at once, on Redis's own clock: the one script of `RedisRateLimiter<[u64; N]>` and
-- `RedisKeyedRateLimiter<K, [u64; N]>`.
--
-- KEYS[1]  the quota's state, every limit of it in one string (so in one Cluster slot): one
--          byte, its format version (VERSION below, 1), then little-endian doubles
--          <at, a_1, b_1, ..., a_M, b_M>: the Redis time <at> (whole microseconds; in the
--          future while grants are queued: the instant of the latest grant), then two doubles
--          per limit: a bucket's level at <at> (tokens, a fraction; negative while a debt is
--          paid) and its <room> (see "Tokens given back while grants wait"; 0 as written by
--          builds before it, which read it as nothing and leave it as it is); a fixed window's
--          number <index> (windows counted from the origin) and
--          what was used in it <used> (above the quota: carried into the next windows).
--          9 + 16 * M bytes; then, once a limit was set (mode "limit"), every limit as the
--          quota holds it, four doubles each (kind, x, y, z as in ARGV[2]), which override
--          ARGV[2]'s: 9 + 48 * M bytes. A missing key is every bucket full and every window
--          unused. A key without limits set expires when every bucket would be full again and
--          every carry is spent; a key with them is configuration and does not expire.
-- ARGV[1]  the mode. "reserve": grant at the earliest instant, not before the latest grant
--          (FIFO across processes, in arrival order at Redis), at which every limit has room,
--          charging every limit at that instant; "try": grant only if that instant is now,
--          otherwise refuse and take nothing; "settle": correct every limit by a signed amount
--          (a bucket's refund is capped at its burst; a window gives back only within the
--          window the grant was charged in, never below 0; a charge may leave a debt, or a
--          carry); "limit": replace limit ARGV[3]'s index by ARGV[3]'s, keeping its level (a
--          bucket's tokens, at most the new burst; a window's use of the current window);
--          "clear": give every limit ARGV[2]'s again (the builder's), keeping levels as
--          "limit" does, and drop the limits kept in the state (so it expires again).
-- ARGV[2]  M limits, five little-endian doubles each (40 bytes):
--          kind      0: a token bucket; 1: a fixed window
--          x, y, z   a bucket: microseconds per token (may be fractional), burst, 0;
--                    a window: its length in microseconds, its quota, its phase (the origin's
--                    Unix time modulo the length, in microseconds)
--          amount    "reserve"/"try": the cost on this limit's dimension; "settle": the
--                    correction (negative: given back; positive: charged)
-- ARGV[3]  "reserve" only, optional: a double, the longest wait, in microseconds, to grant
--          with: a reservation that would wait longer is refused, taking nothing.
--          "settle" only: a double, the Redis time the grant was charged at (for windows).
--          "limit" only: five doubles: the limit's index (from 1), kind, x, y, z.
--          "try" only, optional: a lease: two doubles per limit, its dimension (a number from
--          0) and the most to take beyond the cost on that dimension; a grant then also takes,
--          per dimension, the least any of its limits has room for beyond the cost (whole
--          tokens, at most that most), charged at once like the cost.
-- ARGV[4]  "reserve" only, optional: a lease, as ARGV[3] of "try" (ARGV[3] must then be
--          given: a longest wait that is never exceeded stands for none); the room is
--          counted at the grant's instant, and a reservation takes a lease only if every
--          dimension asked for has room (otherwise none: a lease that cannot cover a cost
--          would only hold tokens back).
--
-- Tokens given back while grants wait. A grant charged for a later instant than now cannot be
-- moved: its process sleeps until that instant. Tokens given back now (a settle below the
-- charge, a lease or a reservation given back) would let a later request go at the same
-- instant as such a grant, and break the bound there. So while grants wait, a bucket takes back
-- at most its <room>: a burst minus the most any waiting grant found in the bucket when it was
-- charged, less what was already given back meanwhile. That is what the bucket would hold
-- after those grants had the tokens never been taken; the rest is lost, as a full bucket loses
-- its refill. Once no grant waits, the room is the whole burst again.
--
-- Format versions: as gcra.lua. A state whose first byte is another version, or whose length
-- is not this limiter's number of limits, is answered with an error and left as it is.
--
-- Returns { granted, wait_us, at }: granted = 1, usable after wait_us (0: at once), charged at
-- Redis time <at> (a "try" with a lease: then what each limit's dimension took beyond the
-- cost, one number per limit); granted = 0, refused, taking nothing, grantable in wait_us. wait_us =
-- NEVER_US means never.
local VERSION = 1
local NEVER_US = 18446744073709552 -- ceil(2^64 / 1000), a double exactly
local EXACT = 2 ^ 53

local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local mode = ARGV[1]
local spec = ARGV[2]
local m = #spec / 40
local kind, x, y, z, amount, a, b = {}, {}, {}, {}, {}, {}, {}
-- ARGV[2]'s limits, before the state's override them ("clear" gives them back).
local given = {}
for i = 1, m do
  kind[i], x[i], y[i], z[i], amount[i] = struct.unpack('<ddddd', spec, (i - 1) * 40 + 1)
  given[i] = { kind[i], x[i], y[i], z[i] }
  if kind[i] == 0 then
    a[i], b[i] = y[i], y[i]
  else
    a[i], b[i] = 0, 0
  end
end

local function not_a_quota()
  return redis.error_reply('ERR paced: the key ' .. key ..
    ' holds a string that is not a paced quota; delete it or choose another key')
end

local at = now
local limited = false
-- A key of another type fails here with Redis's WRONGTYPE.
local state = redis.call('GET', key)
if state then
  local version = string.byte(state)
  if version and version ~= VERSION then
    return redis.error_reply('ERR paced: the key ' .. key .. ' holds format version ' ..
      version .. ', which this paced does not read (it reads version ' .. VERSION ..
      ' of the multi-limit state): a state written by a later paced (upgrade this process;' ..
      ' see the guide on upgrading a fleet), or not a paced quota (delete it or choose another key)')
  end
  if #state == 9 + 48 * m then
    limited = true
    for i = 1, m do
      kind[i], x[i], y[i], z[i] = struct.unpack('<dddd', state, 10 + 16 * m + 32 * (i - 1))
      if kind[i] == 0 then
        a[i] = y[i]
      end
    end
  elseif #state ~= 9 + 16 * m then
    return redis.error_reply('ERR paced: the key ' .. key .. ' holds ' .. (#state - 9) / 16 ..
      ' limits, this limiter has ' .. m .. ', or is not a paced quota; delete it or choose' ..
      ' another name')
  end
  at = struct.unpack('<d', state, 2)
  if not (at >= 0 and at <= EXACT and at == math.floor(at)) then
    return not_a_quota()
  end
  for i = 1, m do
    local u, v = struct.unpack('<dd', state, 10 + 16 * (i - 1))
    if not (u - u == 0 and v - v == 0) then
      return not_a_quota()
    end
    if kind[i] == 0 then
      if now > at then
        u = u + (now - at) / x[i]
      end
      u = math.min(u, y[i])
      if at <= now then
        -- No grant waits: the whole burst may come back.
        v = y[i]
      end
    end
    a[i], b[i] = u, v
  end
end
-- Every bucket's level is now at t0: now, or the latest grant's instant if that is later.
local t0 = math.max(now, at)

-- A fixed window: the number of the window holding t, its start, what is used in window k.
local function number(i, t)
  return math.floor((t - z[i]) / x[i])
end
local function start(i, k)
  return k * x[i] + z[i]
end
local function used_in(i, k)
  return math.max(0, b[i] - (k - a[i]) * y[i])
end
local function current(i, t)
  return math.max(number(i, t), a[i])
end
local function commit(i, t, c)
  local k = current(i, t)
  a[i], b[i] = k, used_in(i, k) + c
end

local function store(t)
  local until_us = t
  local parts = { struct.pack('<Bd', VERSION, t) }
  for i = 1, m do
    parts[i + 1] = struct.pack('<dd', a[i], b[i])
    if kind[i] == 0 then
      until_us = math.max(until_us, t + (y[i] - a[i]) * x[i])
    elseif b[i] > 0 then
      until_us = math.max(until_us, start(i, a[i] + math.ceil(b[i] / y[i])))
    end
  end
  if limited then
    for i = 1, m do
      parts[m + 1 + i] = struct.pack('<dddd', kind[i], x[i], y[i], z[i])
    end
  end
  local ttl_ms = math.ceil((until_us - now) / 1000) + 1
  local value = table.concat(parts)
  if limited then
    redis.call('SET', key, value)
  elseif ttl_ms < EXACT then
    redis.call('SET', key, value, 'PX', string.format('%d', ttl_ms))
  else
    redis.call('SET', key, value)
  end
end

if mode == 'limit' then
  local i, k2, x2, y2, z2 = struct.unpack('<ddddd', ARGV[3])
  if i < 1 or i > m or i ~= math.floor(i) then
    return redis.error_reply('ERR paced: no limit ' .. i .. ' in ' .. key)
  end
  if k2 ~= kind[i] then
    return redis.error_reply('ERR paced: limit ' .. i .. ' of ' .. key .. ' is of the other kind')
  end
  if kind[i] == 0 then
    a[i] = math.min(a[i], y2)
    x[i], y[i] = x2, y2
  else
    local used = used_in(i, current(i, t0))
    x[i], y[i], z[i] = x2, y2, z2
    a[i], b[i] = number(i, t0), used
  end
  limited = true
  store(t0)
  return { 1, 0, t0 }
end

if mode == 'clear' then
  if not state then
    return { 1, 0, t0 }
  end
  for i = 1, m do
    if given[i][1] ~= kind[i] then
      return redis.error_reply('ERR paced: limit ' .. i .. ' of ' .. key .. ' is of the other kind')
    end
  end
  for i = 1, m do
    local _, x2, y2, z2 = unpack(given[i])
    if kind[i] == 0 then
      a[i] = math.min(a[i], y2)
      x[i], y[i] = x2, y2
    else
      local used = used_in(i, current(i, t0))
      x[i], y[i], z[i] = x2, y2, z2
      a[i], b[i] = number(i, t0), used
    end
  end
  limited = false
  store(t0)
  return { 1, 0, t0 }
end

if mode == 'settle' then
  local charged_at = ARGV[3] and struct.unpack('<d', ARGV[3]) or t0
  for i = 1, m do
    local c = amount[i]
    if kind[i] == 0 then
      if c < 0 then
        local back = math.max(0, math.min(-c, b[i]))
        a[i] = math.min(y[i], a[i] + back)
        b[i] = b[i] - back
      elseif c > 0 then
        a[i] = a[i] - c
      end
    elseif c > 0 then
      commit(i, t0, c)
    elseif c < 0 then
      local k = number(i, charged_at)
      if number(i, now) == k and a[i] == k then
        b[i] = math.max(0, b[i] + c)
      end
    end
  end
  store(t0)
  return { 1, 0, t0 }
end

-- A "try", or a reservation with a longest wait (`acquire_timeout`), can never have a cost
-- above a bucket's burst without waiting: never. (A reservation without one waits for the
-- bucket to fill and the rest to flow in.)
local max_wait = mode == 'reserve' and ARGV[3] and struct.unpack('<d', ARGV[3])
local timed = mode == 'try' or (max_wait and max_wait < NEVER_US)
-- The earliest instant at which every limit has room: the latest of the limits' own.
local ready = t0
for i = 1, m do
  local c = amount[i]
  if c > 0 then
    if kind[i] == 0 and c > y[i] and timed then
      return { 0, NEVER_US, 0 }
    end
    if kind[i] == 0 then
      if a[i] < c then
        -- For a cost above the burst: full, then the rest (its debt paid before it passes).
        local wait = math.ceil((c - a[i]) * x[i])
        if wait >= NEVER_US then
          return { 0, NEVER_US, 0 }
        end
        ready = math.max(ready, t0 + wait)
      end
    else
      -- A window with room for c, or (for a cost above the quota) one with nothing used.
      local room = math.max(0, y[i] - c)
      if used_in(i, current(i, t0)) > room then
        local n = math.ceil((b[i] - room) / y[i])
        ready = math.max(ready, math.ceil(start(i, a[i] + n)))
      end
    end
  end
end
local wait = ready - now
if wait >= NEVER_US or ready > EXACT then
  return { 0, NEVER_US, 0 }
end
if mode == 'try' and wait > 0 then
  return { 0, wait, 0 }
end
if max_wait and wait > max_wait then
  return { 0, wait, 0 }
end
-- A lease ("try" only, so granted now: ready = t0): per dimension, the least room beyond the
-- cost of any of its limits, whole tokens, at most the most asked for.
local leased = nil
local lease_arg = (mode == 'try' and ARGV[3]) or (mode == 'reserve' and ARGV[4])
if lease_arg then
  local dim, extra, wanted = {}, {}, {}
  for i = 1, m do
    local d, want = struct.unpack('<dd', lease_arg, (i - 1) * 16 + 1)
    local room
    if kind[i] == 0 then
      local l = a[i]
      if ready > t0 then
        l = math.min(y[i], l + (ready - t0) / x[i])
      end
      if amount[i] > y[i] then
        l = 0
      end
      room = l - amount[i]
    else
      room = y[i] - used_in(i, current(i, ready)) - amount[i]
    end
    room = math.max(0, math.floor(room))
    dim[i] = d
    extra[d] = math.min(extra[d] or want, room)
    wanted[d] = want > 0
  end
  if mode == 'reserve' then
    for d, w in pairs(wanted) do
      if w and extra[d] == 0 then
        extra = {}
        break
      end
    end
  end
  leased = {}
  for i = 1, m do
    leased[i] = extra[dim[i]] or 0
    amount[i] = amount[i] + leased[i]
  end
end
for i = 1, m do
  local c = amount[i]
  if kind[i] == 0 then
    local l = a[i]
    if ready > t0 then
      l = math.min(y[i], l + (ready - t0) / x[i])
    end
    if ready > now and c > 0 then
      -- A grant that waits: tokens given back before its instant must leave room for it.
      b[i] = math.min(b[i], y[i] - l)
    end
    if c > y[i] then
      -- It waited for the whole of it to flow in: it leaves an empty bucket.
      l = 0
    else
      l = l - c
    end
    a[i] = l
  elseif c > 0 then
    commit(i, ready, c)
  end
end
store(ready)
if leased then
  local reply = { 1, wait, ready }
  for i = 1, m do
    reply[3 + i] = leased[i]
  end
  return reply
end
return { 1, wait, ready }
