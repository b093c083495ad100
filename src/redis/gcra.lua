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
-- ARGV[5]  tokens to give back first (an unused lease)
--
-- Returns { taken, wait_us }:
--   taken > 0   granted `taken` tokens; wait_us > 0 only for a cost above the burst, which took
--               the full bucket and pays the rest of its debt by waiting that long before use;
--   taken = 0   refused; the tokens asked for will be there in wait_us.
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

local level = burst
local state = redis.call('GET', KEYS[1])
if state then
  local sep = string.find(state, ':', 1, true)
  level = tonumber(string.sub(state, 1, sep - 1))
  local at = tonumber(string.sub(state, sep + 1))
  if now > at then
    level = math.min(burst, level + (now - at) / interval)
  end
end
if back > 0 then
  level = math.min(burst, level + back)
end

local function store(held)
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

if cost > burst then
  if level < burst then
    store(level)
    return { 0, math.ceil((burst - level) * interval) }
  end
  -- Full: take all of it and charge the whole cost, as if the item left once its debt is
  -- paid (in wait_us), with the bucket empty then.
  store(burst - cost)
  return { cost, math.ceil((cost - burst) * interval) }
end

-- A plain request takes `cost` as soon as it is there; a lease waits until the whole lease
-- is there, so that each round trip brings back a full one.
local need = math.max(cost, math.min(want, burst))
if level >= need then
  local take = math.max(need, math.min(want, math.floor(level)))
  store(level - take)
  return { take, 0 }
end
store(level)
return { 0, math.ceil((need - level) * interval) }
