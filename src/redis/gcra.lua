-- pacer's token bucket in Redis, on Redis's own clock.
--
-- KEYS[1]  the quota: "<level>:<at>", the tokens it held (a fraction; negative while a cost
--          above the burst pays its debt) at Redis time <at>, in whole microseconds. A missing
--          key is a full bucket; the key expires when the bucket would be full again.
-- KEYS[2]  (optional) the key's own limit, a hash { interval = ARGV[1]'s unit, burst } that,
--          when present, overrides ARGV[1] and ARGV[2]. It is configuration: it has no expiry.
--          (With Redis Cluster, name KEYS[1] and KEYS[2] with the same hash tag.)
-- ARGV[1]  microseconds per token (may be fractional): the default limit
-- ARGV[2]  burst: the bucket's capacity, in tokens: the default limit
-- ARGV[3]  cost: the least to take
-- ARGV[4]  want: the most to take (a lease), at least `cost`; a lease is granted only whole
--          (or the whole burst, if smaller)
-- ARGV[5]  tokens to give back first (an unused lease, a cancelled reservation)
-- ARGV[6]  "reserve": always grant, with how long to wait before use, charging now so that
--          later requests queue behind this one (across processes, in arrival order at Redis);
--          "try": grant `cost` only if it is there now, otherwise refuse and take nothing;
--          "limit": give the key the limit ARGV[8], ARGV[9] in KEYS[2], keeping its level (in
--          tokens, at most the new burst; a full bucket stays full); "clear": delete KEYS[2],
--          back to the default limit, keeping the level likewise. Both return { 1, 0, 0 }.
-- ARGV[7]  ("reserve" only; empty for none) the longest wait, in microseconds, to grant with:
--          a reservation that would wait longer is refused, taking nothing, as a "try" is
-- ARGV[8]  ("limit" only) the key's microseconds per token
-- ARGV[9]  ("limit" only) the key's burst
--
-- A refusal writes nothing (unless it gives tokens back): asking a key that is out of tokens
-- costs Redis no write, and leaves its expiry as it was.
--
-- Returns { granted, surplus, wait_us }:
--   granted = 1  granted `cost` and `surplus` tokens more (a lease), usable after wait_us (0: at
--                once). A reservation that must wait takes the whole lease (or the cost) and
--                leaves the level negative: its debt, which later requests wait behind.
--   granted = 0  ("try" only) refused; `cost` will be there in wait_us.
--   wait_us is at most NEVER_US, which stands for "never" (see below).
--
-- The level is kept rather than an absolute "full at" time: times near Redis's clock (about
-- 1.8e15 us) are exact as whole microseconds in a double but not as fractions of one, while a
-- level of a few tokens keeps every fraction.
--
-- Exactness. Lua's numbers are doubles. Redis's clock in microseconds is below 2^53 (about
-- 9.0e15), so every `now` and `at` is exact. Token amounts are exact integers up to 2^53; the
-- client sends larger ones rounded in the quota's favour (a cost up; a burst, a lease and tokens
-- given back down), so rounding them never grants more than the bound. The level, the refill
-- `(now - at) / interval` and the products with `interval` are rounded to the nearest double:
-- a relative error of about 1e-16, whatever the rate (a double spans 1e-308 to 1e308, and the
-- extreme rates give intervals of 5.4e-23 us for 2^64 tokens per nanosecond and 1.8e25 us for
-- one token per `Duration::MAX`). Waits are rounded up to whole microseconds.
--
-- Beyond that range nothing is granted early: whatever Redis reads or returns as an integer is
-- clamped first and written with '%d', never in exponent notation. A wait of 2^64 ns (about
-- 584 years, when the client's nanosecond clock saturates) or more is returned as NEVER_US,
-- which the client reads as "never", as the in-process bucket does. A key whose bucket would
-- take longer than MAX_TTL_MS (2^53 ms, about 285,000 years) to be full again is kept without
-- an expiry rather than let expire early, which would hand out a full bucket too soon.
local NEVER_US = 18446744073709552 -- ceil(2^64 / 1000), a double exactly
local EXACT = 2 ^ 53 -- every integer up to here is a double
local MAX_TTL_MS = EXACT

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local back = tonumber(ARGV[5])
local mode = ARGV[6]
local reserve = mode == 'reserve'
local max_wait = tonumber(ARGV[7] or '')
local default_interval, default_burst = interval, burst

if KEYS[2] then
  -- A key of another type fails here with Redis's WRONGTYPE.
  local own = redis.call('HMGET', KEYS[2], 'interval', 'burst')
  local own_interval, own_burst = tonumber(own[1] or ''), tonumber(own[2] or '')
  if own_interval and own_burst then
    interval, burst = own_interval, own_burst
  elseif own[1] or own[2] then
    return redis.error_reply('ERR pacer: the key ' .. KEYS[2] ..
      ' holds a hash that is not a pacer limit; delete it or choose another key')
  end
end

local level = burst
-- A key of another type fails here with Redis's WRONGTYPE.
local state = redis.call('GET', KEYS[1])
if state then
  local sep = string.find(state, ':', 1, true)
  local at
  if sep then
    level = tonumber(string.sub(state, 1, sep - 1))
    at = tonumber(string.sub(state, sep + 1))
  end
  -- (x == x is false for NaN; tonumber accepts "nan" and "inf".)
  if not (level and at and level == level and at == at
          and math.abs(level) < math.huge and math.abs(at) < math.huge) then
    return redis.error_reply('ERR pacer: the key ' .. KEYS[1] ..
      ' holds a string that is not a pacer quota; delete it or choose another key')
  end
  if now > at then
    level = math.min(burst, level + (now - at) / interval)
  end
end
if back > 0 then
  level = math.min(burst, level + back)
end

local function store(held)
  -- Negative while reservations wait: the key lives until the debt is paid and the bucket
  -- refilled.
  if held >= burst then
    redis.call('DEL', KEYS[1])
    return
  end
  local value = string.format('%.17g:%d', held, now)
  local ttl_ms = math.ceil((burst - held) * interval / 1000) + 1
  if ttl_ms < MAX_TTL_MS then
    redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ttl_ms))
  else
    redis.call('SET', KEYS[1], value)
  end
end

-- A wait in whole microseconds, as an integer reply can carry it.
local function wait_us(tokens)
  local wait = math.ceil(tokens * interval)
  if wait >= NEVER_US then
    return NEVER_US
  end
  return wait
end

-- What a grant of `take` holds beyond `cost`, as an integer reply can carry it.
local function surplus(take)
  return math.min(math.max(0, math.floor(take - cost)), EXACT)
end

if mode == 'limit' or mode == 'clear' then
  -- A full bucket stays full (no key) under the new limit, as a key without state starts full.
  local full = level >= burst
  if mode == 'limit' then
    interval, burst = tonumber(ARGV[8]), tonumber(ARGV[9])
    redis.call('HSET', KEYS[2], 'interval', ARGV[8], 'burst', ARGV[9])
  else
    interval, burst = default_interval, default_burst
    redis.call('DEL', KEYS[2])
  end
  if full then
    redis.call('DEL', KEYS[1])
  else
    store(math.min(level, burst))
  end
  return { 1, 0, 0 }
end

if want == 0 then
  if back > 0 then
    store(level)
  end
  return { 0, 0, 0 }
end

-- A reservation with a lease waits for the whole lease (or the whole burst, if smaller), so that
-- each round trip brings one back; a plain request or a try needs just its cost.
local need = cost
if reserve then
  need = math.max(cost, math.min(want, burst))
end
if level >= need then
  local take = math.max(need, math.min(want, math.floor(level)))
  store(level - take)
  return { 1, surplus(take), 0 }
end
-- A refusal: nothing to write unless tokens were given back.
local function refuse(tokens)
  if back > 0 then
    store(level)
  end
  return { 0, 0, wait_us(math.max(0, tokens - level)) }
end
if not reserve then
  if cost > burst then
    -- Never without waiting (a limit set for the key may be below the client's burst).
    local refused = refuse(cost)
    refused[3] = NEVER_US
    return refused
  end
  return refuse(cost)
end
-- A cost whose debt alone (beyond a full bucket) takes 2^64 ns or more is never granted, as in
-- process; it is not charged, so it holds nobody up. (The client of a single quota knows this
-- already; a keyed client does not know a key's own limit.)
if (cost - burst) * interval >= NEVER_US then
  if back > 0 then
    store(level)
  end
  return { 1, 0, NEVER_US }
end
-- Reserve: charge now, use once the level would have reached what is taken. For a cost above
-- the burst this is "full, then the rest", as in the local bucket.
local take = math.max(cost, want)
local wait = wait_us(take - level)
if max_wait and wait > max_wait then
  -- Too long for the whole lease: the cost alone, if that is soon enough.
  take = cost
  wait = wait_us(math.max(0, cost - level))
  if wait > max_wait then
    return refuse(cost)
  end
end
store(level - take)
return { 1, surplus(take), wait }
