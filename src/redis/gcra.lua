-- pacer's token bucket (GCRA) in Redis, on Redis's own clock.
--
-- KEYS[1]  the quota: the instant (microseconds, Redis TIME) from which the bucket is full.
--          A missing key is a full bucket; the key expires when the bucket would be full.
-- ARGV[1]  microseconds per token (may be fractional)
-- ARGV[2]  burst: the bucket's capacity, in tokens
-- ARGV[3]  cost: the least to take
-- ARGV[4]  want: the most to take (a lease), at least `cost`; a lease is granted only whole
--          (or the whole burst, if smaller)
-- ARGV[5]  tokens to give back first (an unused lease)
--
-- Returns { taken, wait_us }:
--   taken > 0   granted `taken` tokens; wait_us > 0 only for a cost above the burst, which took
--               the full bucket and pays the rest of its debt by waiting that long before it
--               is used;
--   taken = 0   refused; `want` tokens (at most the burst) will be there in wait_us.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local back = tonumber(ARGV[5])

local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
if back > 0 then
  tat = math.max(now, tat - back * interval)
end

local function store(full_at)
  if full_at <= now then
    redis.call('DEL', KEYS[1])
  else
    local ttl_ms = math.ceil((full_at - now) / 1000) + 1
    redis.call('SET', KEYS[1], string.format('%.3f', full_at), 'PX', ttl_ms)
  end
end

if want == 0 then
  store(tat)
  return { 0, 0 }
end

if cost > burst then
  if tat > now then
    store(tat)
    return { 0, math.ceil(tat - now) }
  end
  -- Full: take all of it now and charge the whole cost, as if the item left once its debt is
  -- paid (in wait_us) with the bucket empty then.
  store(now + cost * interval)
  return { cost, math.ceil((cost - burst) * interval) }
end

-- A plain request takes `cost` as soon as it is there; a lease waits until the whole lease
-- (at most the burst) is there, so that each round trip brings back a full one.
local level = burst - (tat - now) / interval
local need = math.max(cost, math.min(want, burst))
if level >= need then
  local take = math.max(need, math.min(want, math.floor(level)))
  store(tat + take * interval)
  return { take, 0 }
end
store(tat)
return { 0, math.ceil((need - level) * interval) }
