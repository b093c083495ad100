-- paced's token bucket in Redis, on Redis's own clock: the one script of the one-limit
-- `RedisRateLimiter` and `RedisKeyedRateLimiter`.
--
-- KEYS[1]  the quota's state: one byte, its format version (VERSION below, 1), then
--          little-endian doubles. 17 bytes, <1, level, at>: the tokens it held (a fraction;
--          negative while a cost above the burst pays its debt) at Redis time <at>, in whole
--          microseconds; or 33 bytes, <1, level, at, interval, burst>, for a key given its own
--          limit (mode "limit"), which then overrides the default limit of ARGV[2]. A missing
--          key is a full bucket under the default limit. A key under the default limit expires
--          when its bucket would be full again; a key with its own limit is configuration and
--          does not expire.
-- ARGV[1]  the mode. "reserve": always grant, with how long to wait before use, charging now so
--          that later requests queue behind this one (across processes, in arrival order at
--          Redis); "try": grant `cost` only if it is there now, otherwise refuse and take
--          nothing; "limit": give the key the limit of ARGV[3], keeping its level (in tokens, at
--          most the new burst; a full bucket stays full); "clear": back to the default limit,
--          keeping the level likewise. Both return { 1, 0, 0 }.
-- ARGV[2]  five little-endian doubles (40 bytes):
--          interval  microseconds per token (may be fractional): the default limit
--          burst     the bucket's capacity, in tokens: the default limit
--          cost      the least to take
--          want      the most to take (a lease), at least `cost`; a lease is granted only whole
--                    (or the whole burst, if smaller)
--          back      tokens to give back first (an unused lease, a cancelled reservation)
--          and optionally a sixth (48 bytes):
--          back_at   the Redis instant, in microseconds, the tokens given back were charged
--                    for, when they are one reservation's alone
-- ARGV[3]  ("reserve" only, optional) a double: the longest wait, in microseconds, to grant
--          with: a reservation that would wait longer is refused, taking nothing, as a "try" is;
--          ("limit" only) two doubles: the key's microseconds per token and burst
--
-- The numbers travel and rest as doubles in binary (Redis's Lua `struct` library) rather than
-- as text: parsing and printing decimal numbers was most of the script's own cost, and binary
-- keeps every bit.
--
-- Format versions. Every write stores VERSION. A state whose first byte is another version (a
-- later paced's format, or a string that is not a paced quota) is answered with an error that
-- names the version found and the one read here, and is left as it is: never read as this
-- version, never reset, never overwritten (paced's guide, "Upgrading a fleet", says in which
-- order a later format is rolled out). A state of this version with the wrong length or
-- impossible numbers is not a paced quota either.
--
-- A refusal writes nothing (unless it gives tokens back): asking a key that is out of tokens
-- costs Redis no write, and leaves its expiry as it was.
--
-- Tokens given back while grants wait. A level below zero means grants charged for later
-- instants wait (the last of them when the level is back at zero); their processes sleep until
-- those instants, which cannot move. Tokens given back then (an unused lease, a reservation
-- whose waiter went away) would let a later request go at the same instant as a waiting grant
-- and break the bound there, so they are not taken back: lost, as a full bucket loses its
-- refill. Two cases count in full (up to the burst): tokens given back while no grant waits,
-- and those of the last grant charged, given back with its instant (ARGV[2]'s back_at): no
-- grant was charged after it, so taking it back is exact.
--
-- Returns { granted, surplus, wait_us, at }:
--   granted = 1  granted `cost` and `surplus` tokens more (a lease), usable after wait_us (0: at
--                once), at Redis time <at> (now + wait_us, whole microseconds): the instant
--                the grant is charged for, by which a process orders its own grants of the
--                key. A reservation that must wait takes the whole lease (or the cost) and
--                leaves the level negative: its debt, which later requests wait behind.
--   granted = 0  ("try" only) refused; `cost` will be there in wait_us; <at> is 0.
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
--
-- Cost. This runs on every request: one TIME, one GET, at most one write, no decimal parsing
-- beyond TIME's, no closures.
local VERSION = 1 -- the state's format: the only one this script reads, and the one it writes
local NEVER_US = 18446744073709552 -- ceil(2^64 / 1000), a double exactly
local EXACT = 2 ^ 53 -- every integer up to here is a double
local MAX_TTL_MS = EXACT

local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local mode = ARGV[1]
local interval, burst, cost, want, back = struct.unpack('<ddddd', ARGV[2])
local back_at = #ARGV[2] == 48 and struct.unpack('<d', ARGV[2], 41)
-- The key's own limit as stored after its level and time (16 bytes), or '' for none.
local own = ''

local level, at, reply = burst, nil, nil
-- A key of another type fails here with Redis's WRONGTYPE.
local state = redis.call('GET', key)
if state then
  local version = string.byte(state)
  if version and version ~= VERSION then
    return redis.error_reply('ERR paced: the key ' .. key .. ' holds format version ' ..
      version .. ', which this paced does not read (it reads version ' .. VERSION ..
      '): a state written by a later paced (upgrade this process; see the guide on upgrading' ..
      ' a fleet), or not a paced quota (delete it or choose another key)')
  end
  local size = #state
  local own_interval, own_burst
  if size == 17 then
    level, at = struct.unpack('<dd', state, 2)
  elseif size == 33 then
    level, at, own_interval, own_burst = struct.unpack('<dddd', state, 2)
    if own_interval > 0 and own_interval - own_interval == 0 and own_burst >= 1
        and own_burst - own_burst == 0 then
      interval, burst, own = own_interval, own_burst, string.sub(state, 18)
    else
      at = nil
    end
  end
  -- A time is a whole number of microseconds; a level is finite (x - x == 0 is false for an
  -- infinity and for NaN).
  if not (at and at >= 0 and at <= EXACT and at == math.floor(at) and level - level == 0) then
    return redis.error_reply('ERR paced: the key ' .. key ..
      ' holds a string that is not a paced quota; delete it or choose another key')
  end
  if now > at then
    level = level + (now - at) / interval
  end
  -- (Also when processes disagree about the default burst.)
  if level > burst then
    level = burst
  end
end
if back > 0 then
  -- See "Tokens given back while grants wait": the last grant (back at zero), given back, is
  -- as if never charged.
  -- Its instant, read back from the level, is as exact as doubles allow: a few units in the
  -- last place off, which beyond 2^53 µs (a debt of centuries) is more than a microsecond.
  local last = now - level * interval
  local _, exponent = math.frexp(last)
  if level >= 0 or (back_at and back_at + 1 + 8 * 2 ^ (exponent - 53) >= last) then
    level = math.min(burst, level + back)
  end
end
-- The level to store, if this request changes it.
local held

if mode == 'limit' or mode == 'clear' then
  -- A full bucket stays full under the new limit, as a key without state starts full.
  local full = level >= burst
  if mode == 'limit' then
    own = ARGV[3]
    interval, burst = struct.unpack('<dd', own)
  else
    interval, burst = struct.unpack('<dd', ARGV[2])
    own = ''
  end
  if full then
    level = burst
  end
  held = math.min(level, burst)
  reply = { 1, 0, 0, now }
else
  local reserve = mode == 'reserve'
  -- A reservation with a lease waits for the whole lease (or the whole burst, if smaller), so
  -- that each round trip brings one back; a plain request or a try needs just its cost.
  local need = cost
  if reserve then
    need = math.max(cost, math.min(want, burst))
  end
  if want == 0 then
    reply = { 0, 0, 0, 0 }
  elseif level >= need then
    local take = math.max(need, math.min(want, math.floor(level)))
    held = level - take
    reply = { 1, math.min(math.max(0, math.floor(take - cost)), EXACT), 0, now }
  elseif not reserve or (cost - burst) * interval >= NEVER_US then
    -- A refusal (or, for a reservation whose debt alone beyond a full bucket takes 2^64 ns or
    -- more, never granted, as in process; it is not charged, so it holds nobody up): nothing to
    -- write unless tokens were given back.
    if reserve then
      reply = { 1, 0, NEVER_US, 0 }
    elseif cost > burst then
      -- Never without waiting (a limit set for the key may be below the client's burst).
      reply = { 0, 0, NEVER_US, 0 }
    else
      reply = { 0, 0, math.min(math.ceil((cost - level) * interval), NEVER_US), 0 }
    end
  else
    -- Reserve: charge now, use once the level would have reached what is taken. For a cost
    -- above the burst this is "full, then the rest", as in the local bucket.
    local take = math.max(cost, want)
    local wait = math.min(math.ceil((take - level) * interval), NEVER_US)
    local max_wait = ARGV[3] and struct.unpack('<d', ARGV[3])
    if max_wait and wait > max_wait then
      -- Too long for the whole lease: the cost alone, if that is soon enough.
      take = cost
      wait = math.min(math.ceil(math.max(0, cost - level) * interval), NEVER_US)
    end
    local timed = max_wait and max_wait < NEVER_US
    if timed and cost > burst then
      -- With a longest wait (`acquire_timeout`), a cost above the burst is never, as a try's.
      reply = { 0, 0, NEVER_US, 0 }
    elseif max_wait and wait > max_wait then
      reply = { 0, 0, wait, 0 }
    elseif wait >= NEVER_US then
      -- Never (the debts ahead of it take 584 years or more): not charged, so it holds nobody
      -- up, as the client takes it.
      reply = { 1, 0, NEVER_US, 0 }
    else
      held = level - take
      reply = { 1, math.min(math.max(0, math.floor(take - cost)), EXACT), wait, now + wait }
    end
  end
end

if not held then
  if back == 0 then
    return reply
  end
  held = level
end
if held >= burst and own == '' then
  -- Full under the default limit: the same as no key. (A key with its own limit keeps it.)
  if state then
    redis.call('DEL', key)
  end
  return reply
end
-- Negative while reservations wait: the key lives until the debt is paid and the bucket
-- refilled.
local value = struct.pack('<Bdd', VERSION, held, now) .. own
local ttl_ms = math.ceil((burst - held) * interval / 1000) + 1
if own == '' and ttl_ms < MAX_TTL_MS then
  redis.call('SET', key, value, 'PX', string.format('%d', ttl_ms))
else
  redis.call('SET', key, value)
end
return reply
