-- pacer's token bucket in Redis, on Redis's own clock.
--
-- KEYS[1]  the quota: "<level>:<at>", the tokens it held (a fraction; negative while a cost
--          above the burst pays its debt) at Redis time <at>, in whole microseconds. A missing
--          key is a full bucket; the key expires when the bucket would be full again.
-- ARGV[1]  microseconds per token (may be fractional)
-- ARGV[2]  burst: the bucket's capacity, in tokens
-- ARGV[3]  cost: the least to take
-- ARGV[4]  want: the most to take (a lease), at least `cost`; a lease is granted only whole
--          (or the whole burst, if smaller)
-- ARGV[5]  tokens to give back first (an unused lease, a cancelled reservation)
-- ARGV[6]  "reserve": always grant, with how long to wait before use, charging now so that
--          later requests queue behind this one (across processes, in arrival order at Redis);
--          "try": grant `cost` only if it is there now, otherwise refuse and take nothing
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
local reserve = ARGV[6] == 'reserve'

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

if want == 0 then
  store(level)
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
if not reserve then
  store(level)
  return { 0, 0, wait_us(cost - level) }
end
-- Reserve: charge now, use once the level would have reached what is taken. For a cost above
-- the burst this is "full, then the rest", as in the local bucket.
local take = math.max(cost, want)
store(level - take)
return { 1, surplus(take), wait_us(take - level) }
