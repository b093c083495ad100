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
-- Returns { taken, wait_us }:
--   taken > 0   granted `taken` tokens, usable after wait_us (0: at once). A reservation that
--               must wait takes the whole lease (or the cost) and leaves the level negative:
--               its debt, which later requests wait behind.
--   taken = 0   ("try" only) refused; `cost` will be there in wait_us.
--
-- The level is kept rather than an absolute "full at" time: times near Redis's clock (about
-- 1.8e15 us) are exact as whole microseconds in a double but not as fractions of one, while a
-- level of a few tokens keeps every fraction.
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
  else
    local ttl_ms = math.ceil((burst - held) * interval / 1000) + 1
    redis.call('SET', KEYS[1], string.format('%.17g:%d', held, now), 'PX', ttl_ms)
  end
end

if want == 0 then
  store(level)
  return { 0, 0 }
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
  return { take, 0 }
end
if not reserve then
  store(level)
  return { 0, math.ceil((cost - level) * interval) }
end
-- Reserve: charge now, use once the level would have reached what is taken. For a cost above
-- the burst this is "full, then the rest", as in the local bucket.
local take = math.max(cost, want)
store(level - take)
return { take, math.ceil((take - level) * interval) }
