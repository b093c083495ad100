-- paced's several token buckets in Redis, all checked and charged at once, on Redis's own
-- clock: the one script of `RedisMultiRateLimiter`.
--
-- KEYS[1]  the quota's state, every limit of it in one string (so in one Cluster slot): one
--          byte, its format version (VERSION below, 1), then little-endian doubles
--          <at, level_1, ..., level_M>: the Redis time <at> (whole microseconds; in the future
--          while grants are queued: the instant of the latest grant) and each limit's level at
--          <at> (tokens, a fraction; negative while a debt is paid). 9 + 8 * M bytes. A missing
--          key is every bucket full. The key expires when every bucket would be full again.
-- ARGV[1]  the mode. "reserve": grant at the earliest instant, not before the latest grant
--          (FIFO across processes, in arrival order at Redis), at which every limit has room,
--          charging every limit at that instant; "try": grant only if that instant is now,
--          otherwise refuse and take nothing; "settle": correct every limit by a signed amount
--          (a refund is capped at the limit's burst; a charge may leave a debt).
-- ARGV[2]  M limits, three little-endian doubles each (24 bytes):
--          interval  microseconds per token (may be fractional)
--          burst     the bucket's capacity, in tokens
--          amount    "reserve"/"try": the cost on this limit's dimension; "settle": the
--                    correction (negative: given back; positive: charged as debt)
-- ARGV[3]  ("reserve" only, optional) a double: the longest wait, in microseconds, to grant
--          with: a reservation that would wait longer is refused, taking nothing.
--
-- Format versions: as gcra.lua. A state whose first byte is another version, or whose length
-- is not this limiter's number of limits, is answered with an error and left as it is.
--
-- Returns { granted, wait_us }: granted = 1, usable after wait_us (0: at once); granted = 0,
-- refused, taking nothing, grantable in wait_us. wait_us = NEVER_US means never.
local VERSION = 1
local NEVER_US = 18446744073709552 -- ceil(2^64 / 1000), a double exactly
local EXACT = 2 ^ 53

local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local mode = ARGV[1]
local spec = ARGV[2]
local m = #spec / 24
local interval, burst, amount, level = {}, {}, {}, {}
for i = 1, m do
  interval[i], burst[i], amount[i] = struct.unpack('<ddd', spec, (i - 1) * 24 + 1)
  level[i] = burst[i]
end

local at = now
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
  if #state ~= 9 + 8 * m then
    return redis.error_reply('ERR paced: the key ' .. key .. ' holds ' .. (#state - 9) / 8 ..
      ' limits, this limiter has ' .. m .. ', or is not a paced quota; delete it or choose' ..
      ' another name')
  end
  at = struct.unpack('<d', state, 2)
  if not (at >= 0 and at <= EXACT and at == math.floor(at)) then
    return redis.error_reply('ERR paced: the key ' .. key ..
      ' holds a string that is not a paced quota; delete it or choose another key')
  end
  for i = 1, m do
    local l = struct.unpack('<d', state, 10 + 8 * (i - 1))
    if not (l - l == 0) then
      return redis.error_reply('ERR paced: the key ' .. key ..
        ' holds a string that is not a paced quota; delete it or choose another key')
    end
    if now > at then
      l = l + (now - at) / interval[i]
    end
    level[i] = math.min(l, burst[i])
  end
end
-- Every level is now at t0: now, or the latest grant's instant if that is later.
local t0 = math.max(now, at)

local function store(t)
  local ttl_us = t - now
  local full_in = 0
  local parts = { struct.pack('<Bd', VERSION, t) }
  for i = 1, m do
    parts[i + 1] = struct.pack('<d', level[i])
    full_in = math.max(full_in, (burst[i] - level[i]) * interval[i])
  end
  local ttl_ms = math.ceil((ttl_us + full_in) / 1000) + 1
  local value = table.concat(parts)
  if ttl_ms < EXACT then
    redis.call('SET', key, value, 'PX', string.format('%d', ttl_ms))
  else
    redis.call('SET', key, value)
  end
end

if mode == 'settle' then
  for i = 1, m do
    local a = amount[i]
    if a < 0 then
      level[i] = math.min(burst[i], level[i] - a)
    elseif a > 0 then
      level[i] = level[i] - a
    end
  end
  store(t0)
  return { 1, 0 }
end

-- The earliest instant at which every limit has room: the latest of the limits' own.
local ready = t0
for i = 1, m do
  local c = amount[i]
  if c > 0 and level[i] < c then
    -- For a cost above the burst: full, then the rest (its debt paid before it passes).
    local wait = math.ceil((c - level[i]) * interval[i])
    if wait >= NEVER_US then
      return { 0, NEVER_US }
    end
    ready = math.max(ready, t0 + wait)
  end
end
local wait = ready - now
if wait >= NEVER_US or ready > EXACT then
  return { 0, NEVER_US }
end
if mode == 'try' and wait > 0 then
  return { 0, wait }
end
local max_wait = ARGV[3] and struct.unpack('<d', ARGV[3])
if max_wait and wait > max_wait then
  return { 0, wait }
end
for i = 1, m do
  local c = amount[i]
  local l = level[i]
  if ready > t0 then
    l = math.min(burst[i], l + (ready - t0) / interval[i])
  end
  if c > burst[i] then
    -- It waited for the whole of it to flow in: it leaves an empty bucket.
    l = 0
  else
    l = l - c
  end
  level[i] = l
end
store(ready)
return { 1, wait }
