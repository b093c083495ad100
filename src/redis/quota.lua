-- paced's quotas in Redis, on Redis's own clock: the one script of every Redis limiter
-- (`RedisRateLimiter` and `RedisKeyedRateLimiter`, one limit or several). A quota is one or
-- more limits (token buckets and aligned fixed windows), all checked and charged at once.
--
-- KEYS[1]  the quota's state, every limit of it in one string (so in one Cluster slot): one
--          byte, its format version (VERSION below, 1), then little-endian doubles, in one of
--          two forms, as ARGV[2] asks:
--          - the general form: <at, a_1, b_1, ..., a_M, b_M>: the Redis time <at> (whole
--            microseconds; in the future while grants are queued: the instant of the latest
--            grant), then two doubles per limit: a bucket's level at <at> (tokens, a fraction;
--            negative while a debt is paid) and its <room> (see "Tokens given back while
--            grants wait"); a fixed window's number <index> (windows counted from the origin)
--            and what was used in it <used> (above the quota: carried into the next windows).
--            9 + 16 * M bytes; then, once a limit was set (mode "limit"), every limit as the
--            quota holds it, four doubles each (kind, x, y, z as in ARGV[2]): 9 + 48 * M bytes.
--          - the one-bucket form (one limit, a bucket; the one-limit `RedisRateLimiter`'s):
--            <level, at>: the bucket's level at the Redis time <at> of the last write (negative
--            while grants wait: their debt), 17 bytes; then, once a limit was set, its
--            microseconds per token and burst: 33 bytes. It holds no room: while grants wait,
--            only the latest grant's tokens come back.
--          Limits set in the state override ARGV[2]'s. A missing key is every bucket full and
--          every window unused. A key without limits set expires when every bucket would be
--          full again and every carry is spent (and is deleted when that is now); a key with
--          them is configuration and does not expire.
-- ARGV[1]  the mode. "reserve": grant at the earliest instant, not before the latest grant
--          (first come, first served across processes, in arrival order at Redis), at which
--          every limit has room, charging every limit at that instant; "try": grant only if
--          that instant is now, otherwise refuse and take nothing; "settle": correct every
--          limit by a signed amount (tokens given back follow the rules below; a charge may
--          leave a debt, or a carry); "limit": replace limit ARGV[3]'s index by ARGV[3]'s,
--          keeping its level (a bucket's tokens, at most the new burst, a full one-bucket form
--          staying full; a window's use of the current window); "clear": give every limit ARGV[2]'s
--          again (the builder's), keeping levels as "limit" does, and drop the limits kept in
--          the state (so it expires again).
-- ARGV[2]  M limits, five little-endian doubles each (40 bytes):
--          kind      0: a token bucket; 1: a fixed window
--          x, y, z   a bucket: microseconds per token (may be fractional), burst, 0;
--                    a window: its length in microseconds, its quota, its phase (the origin's
--                    Unix time modulo the length, in microseconds)
--          amount    "reserve"/"try": the cost on this limit's dimension; "settle": the
--          correction (negative: given back; positive: charged)
--          then, after one bucket, one byte that asks for the one-bucket form.
-- ARGV[3]  (optional) "reserve": a double, the longest wait in microseconds to grant with (a
--          reservation that would wait longer is refused, taking nothing), or '' for none;
--          "settle": a double, the Redis time the grant was charged at;
--          "limit": five doubles: the limit's index (from 1), kind, x, y, z.
-- ARGV[4]  (optional) "reserve"/"try": a lease, or '' for none: two doubles per limit, its
--          dimension (a number from 0) and the most to take beyond the cost on that dimension,
--          then one double, the rule of a reservation's lease: 1, it waits for the whole lease
--          (at most a bucket's burst or a window's quota), so that each round trip brings one
--          back; 0, it takes what the limits hold at its instant, and never waits longer for
--          it. A grant takes, per dimension, the least any of its limits has room for beyond
--          the cost (whole tokens, at most the most asked for), charged at once like the cost;
--          a reservation takes a lease only if every dimension asked for has room (otherwise
--          none).
-- ARGV[5]  (optional) "reserve"/"try": tokens to give back first (an unused lease, a cancelled
--          reservation): one double per limit, then one double, the Redis time they were
--          charged at (when they are one grant's alone), or -1.
-- Each argument costs Redis about 1,200 instructions: callers leave out the trailing ones.
--
-- Tokens given back while grants wait. A grant charged for a later instant than now cannot be
-- moved: its process sleeps until that instant. Tokens given back now would let a later
-- request go at the same instant as such a grant, and break the bound there. So while grants
-- wait, a bucket takes back in full only the latest grant's tokens (no grant was charged after
-- it, so taking it back is exact, and the state moves back in time as far as every bucket's
-- level, extrapolated back from <at>, stays at or above zero: all the way with one bucket);
-- others, at most its <room>: a burst minus the most any waiting grant found in the bucket
-- when it was charged, less what was already given back meanwhile. That is what the bucket
-- would hold after those grants had the tokens never been taken; the rest is lost, as a full
-- bucket loses its refill. Once no grant waits, the room is the whole burst again. A window
-- takes tokens back only within the window they were charged in, never below 0.
--
-- Format versions. Every write stores VERSION. A state whose first byte is another version (a
-- later paced's format, or a string that is not a paced quota) is answered with an error that
-- names the version found and the one read here, and is left as it is: never read as this
-- version, never reset, never overwritten (paced's guide, "Upgrading a fleet", says in which
-- order a later format is rolled out). A state of this version with the wrong length or
-- impossible numbers is not a paced quota either.
--
-- Exactness. Lua's numbers are doubles. Redis's clock in microseconds is below 2^53 (about
-- 9.0e15), so every `now` and `at` is exact. Token amounts are exact integers up to 2^53; the
-- client sends larger ones rounded in the quota's favour (a cost up; a burst, a lease and tokens
-- given back down), so rounding them never grants more than the bound. Levels and the refills
-- are rounded to the nearest double: a relative error of about 1e-16, whatever the rate. Waits
-- are rounded up to whole microseconds. A wait of 2^64 ns (about 584 years, when the client's
-- nanosecond clock saturates) or more is returned as NEVER_US, which the client reads as
-- "never", as the in-process bucket does; such a grant is not charged, so it holds nobody up.
--
-- Cost. This runs on every request: one TIME, one GET, at most one write (a refusal writes
-- nothing, unless tokens were given back). The common grants (one or two buckets, in either
-- form, a "try" or a reservation without a lease or tokens to give back, no debt) make no
-- table but the reply: a table costs Redis about 2,000 instructions, more than the arithmetic;
-- they do, step for step, what the general path does (`tests/redis_script.rs` checks that both
-- give the same answers and the same states). Otherwise ARGV[2] and the state are each read by
-- one struct.unpack into one table, and each pass reads a limit's numbers once; no closures on
-- a grant.
--
-- Returns { granted, wait_us, at }: granted = 1, usable after wait_us (0: at once), charged at
-- Redis time <at> (with a lease, then what each limit's dimension took beyond the cost, one
-- number per limit); granted = 0, refused, taking nothing, grantable in wait_us. wait_us =
-- NEVER_US means never.
local VERSION = 1
local NEVER_US = 18446744073709552 -- ceil(2^64 / 1000), a double exactly
local EXACT = 2 ^ 53
local NOT_A_QUOTA = ' holds a string that is not a paced quota; delete it or choose another key'

local key = KEYS[1]
local time = redis.call('TIME')
-- Lua converts TIME's two strings as tonumber would, without the calls.
local now = time[1] * 1000000 + time[2]
local mode = ARGV[1]
local spec = ARGV[2]
-- A trailing byte after one bucket asks for the one-bucket form.
local m = (#spec - #spec % 40) / 40
-- The formats of ARGV[2], of the general form's doubles (<at>, then two per limit) and of the
-- general state (its version byte, then those), spelled out for one and two limits: building a
-- string costs Redis more than the comparisons.
local SPEC, LEVELS, STATE
if m == 1 then
  SPEC, LEVELS, STATE = '<ddddd', '<ddd', '<Bddd'
elseif m == 2 then
  SPEC, LEVELS, STATE = '<dddddddddd', '<ddddd', '<Bddddd'
else
  SPEC, LEVELS = string.rep('<ddddd', m), string.rep('<d', 2 * m + 1)
  STATE = '<B' .. LEVELS
end
local charging = mode == 'reserve' or mode == 'try'
local settling = mode == 'settle'
-- A key of another type fails here with Redis's WRONGTYPE.
local state = redis.call('GET', key)

-- The common grants first, without tables: one or two buckets, a "try" or a reservation with
-- neither a lease nor tokens to give back, and no grant waiting (no debt). The same
-- arithmetic as the general path below, step for step, so the same answer and the same state
-- to the bit; any other case (a debt, limits of the key's own, a fixed window, a state that is
-- not a quota) goes on below. ARGV[2] is read into locals (struct.unpack also returns the
-- position after what it read: k2 is that with one limit, and unused). The two buckets' steps
-- are written out twice, not as local functions: Redis would make the closures on every call
-- (7,600 more instructions for two limits, measured).
if charging and m <= 2 and not ARGV[4] and not ARGV[5] then
  local k1, x1, y1, _, c1, k2, x2, y2, _, c2 = struct.unpack(SPEC, spec)
  if m == 1 and #spec == 41 and k1 == 0 then
    local x, y, c = x1, y1, c1
    local u = y
    if state then
      u = nil
      if #state == 17 then
        local version, level, w = struct.unpack('<Bdd', state)
        if version == VERSION and w >= 0 and w <= EXACT and w % 1 == 0 and level - level == 0 then
          if now > w then
            level = level + (now - w) / x
          end
          if level > y then
            level = y
          end
          if level >= 0 then
            u = level
          end
        end
      end
    end
    if u then
      local t = now
      if u < c then
        local wait = math.ceil((c - u) * x)
        local max_wait = mode == 'reserve' and ARGV[3] and ARGV[3] ~= '' and
          struct.unpack('<d', ARGV[3])
        local timed = mode == 'try' or (max_wait and max_wait < NEVER_US)
        if wait >= NEVER_US or (c > y and timed) then
          return { 0, NEVER_US, 0 }
        end
        t = now + wait
        if t > EXACT then
          t = t + 2
          wait = t - now
        end
        if wait >= NEVER_US then
          return { 0, NEVER_US, 0 }
        end
        if mode == 'try' or (max_wait and wait > max_wait) then
          return { 0, wait, 0 }
        end
      end
      local a = u
      if t > now then
        a = u + (t - now) / x
        if a > y then
          a = y
        end
      end
      if c > y then
        a = 0
      elseif c > 0 then
        a = a - c
      end
      local reply = { 1, t - now, t }
      local until_us = t + (y - a) * x
      if t <= now and not (a < y) then
        if state then
          redis.call('DEL', key)
        end
        return reply
      end
      local level = a
      if t > now then
        level = a - (t - now) / x
      end
      local ttl_ms = math.ceil((until_us - now) / 1000) + 1
      local value = struct.pack('<Bdd', VERSION, level, now)
      if ttl_ms < EXACT then
        redis.call('SET', key, value, 'PX', string.format('%d', ttl_ms))
      else
        redis.call('SET', key, value)
      end
      return reply
    end
  elseif k1 == 0 and (m == 1 or k2 == 0) then
    -- Buckets in the general form: each bucket's level u at now (its room is the whole burst:
    -- no grant waits), the instant every bucket holds its cost, then each level at it.
    local at, u1, v1, u2, v2 = now, y1, y1, y2, y2
    if state then
      at = nil
      if #state == 9 + 16 * m then
        -- The version byte and the levels in one call.
        local version
        version, at, u1, v1, u2, v2 = struct.unpack(STATE, state)
        if m == 1 then
          u2, v2 = 0, 0
        end
        -- The sum is finite only if every level is (a sum too large to be finite sends a
        -- sound state to the general path: slower, never wrong).
        local sum = u1 + v1 + u2 + v2
        if not (version == VERSION and at >= 0 and at <= now and at % 1 == 0
            and sum - sum == 0) then
          at = nil
        elseif now > at then
          local gap = now - at
          u1 = u1 + gap / x1
          if m == 2 then
            u2 = u2 + gap / x2
          end
        end
        if y1 < u1 then
          u1 = y1
        end
        if m == 2 and y2 < u2 then
          u2 = y2
        end
      end
    end
    if at then
      local ready, never, over = now, false, false
      if c1 > 0 then
        over = c1 > y1
        if u1 < c1 then
          local wait = math.ceil((c1 - u1) * x1)
          if wait >= NEVER_US then
            never = true
          elseif now + wait > ready then
            ready = now + wait
          end
        end
      end
      if m == 2 and c2 > 0 then
        if c2 > y2 then
          over = true
        end
        if u2 < c2 then
          local wait = math.ceil((c2 - u2) * x2)
          if wait >= NEVER_US then
            never = true
          elseif now + wait > ready then
            ready = now + wait
          end
        end
      end
      local max_wait = mode == 'reserve' and ARGV[3] and ARGV[3] ~= '' and
        struct.unpack('<d', ARGV[3])
      local wait = ready - now
      if ready > EXACT then
        ready = ready + 2
        wait = ready - now
      end
      if never or wait >= NEVER_US
          or (over and (mode == 'try' or (max_wait and max_wait < NEVER_US))) then
        return { 0, NEVER_US, 0 }
      elseif (mode == 'try' and wait > 0) or (max_wait and wait > max_wait) then
        return { 0, wait, 0 }
      end
      local t = ready
      local reply = { 1, wait, t }
      -- Each bucket's level a and room b at t (refilled from now if the grant waits), then
      -- charged its cost.
      local a1, b1, a2, b2 = u1, y1, u2, y2
      if t > now then
        local refill = a1 + (t - now) / x1
        if refill < y1 then
          a1 = refill
        else
          a1 = y1
        end
        if c1 > 0 and y1 - a1 < b1 then
          b1 = y1 - a1
        end
        if m == 2 then
          refill = a2 + (t - now) / x2
          if refill < y2 then
            a2 = refill
          else
            a2 = y2
          end
          if c2 > 0 and y2 - a2 < b2 then
            b2 = y2 - a2
          end
        end
      end
      local until_us = t
      if c1 > 0 then
        if c1 > y1 then
          a1 = 0
        else
          a1 = a1 - c1
        end
      end
      local refilled = t + (y1 - a1) * x1
      if refilled > until_us then
        until_us = refilled
      end
      if m == 2 then
        if c2 > 0 then
          if c2 > y2 then
            a2 = 0
          else
            a2 = a2 - c2
          end
        end
        refilled = t + (y2 - a2) * x2
        if refilled > until_us then
          until_us = refilled
        end
      end
      -- Granted now and every bucket full: nothing to keep.
      if t <= now and not (a1 < y1) and (m == 1 or not (a2 < y2)) then
        if state then
          redis.call('DEL', key)
        end
        return reply
      end
      local value
      if m == 1 then
        value = struct.pack(STATE, VERSION, t, a1, b1)
      else
        value = struct.pack(STATE, VERSION, t, a1, b1, a2, b2)
      end
      local ttl_ms = math.ceil((until_us - now) / 1000) + 1
      if ttl_ms < EXACT then
        redis.call('SET', key, value, 'PX', string.format('%d', ttl_ms))
      else
        redis.call('SET', key, value)
      end
      return reply
    end
  end
end

-- ARGV[2]'s limits in one table: limit i's kind, x, y, z and amount at lim[5 * i - 4 .. 5 * i].
-- A state with limits of its own overrides kind, x, y, z ("clear" reads ARGV[2] again).
local lim = { struct.unpack(SPEC, spec) }
local compact = m == 1 and #spec == 41 and lim[1] == 0
local st
-- The limits kept in the state (packed as stored), or '' for none.
local own = ''
-- How far before <at> a given-back grant's instant still makes it the latest grant: 0 in the
-- general form; in the one-bucket form, whose <at> is read back from the level, the few units
-- in the last place that costs.
local slack = 0
local at = now

if state then
  local version = string.byte(state)
  if version and version ~= VERSION then
    return redis.error_reply('ERR paced: the key ' .. key .. ' holds format version ' ..
      version .. ', which this paced does not read (it reads version ' .. VERSION ..
      '): a state written by a later paced (upgrade this process; see the guide on upgrading' ..
      ' a fleet), or not a paced quota (delete it or choose another key)')
  end
  local size = #state
  if compact then
    local level, w, x, y
    if size == 17 then
      level, w = struct.unpack('<dd', state, 2)
      x, y = lim[2], lim[3]
    elseif size == 33 then
      level, w, x, y = struct.unpack('<dddd', state, 2)
      if x > 0 and x - x == 0 and y >= 1 and y - y == 0 then
        lim[2], lim[3], own = x, y, string.sub(state, 18)
      else
        w = nil
      end
    end
    -- A time is a whole number of microseconds; a level is finite (x - x == 0 is false for
    -- an infinity and for NaN).
    if not (w and w >= 0 and w <= EXACT and w % 1 == 0 and level - level == 0) then
      return redis.error_reply('ERR paced: the key ' .. key .. NOT_A_QUOTA)
    end
    if now > w then
      level = level + (now - w) / x
    end
    if level > y then
      level = y
    end
    if level >= 0 then
      st = { now, level, y }
    else
      -- A debt: the latest grant's instant is when it is paid.
      at = now + math.ceil(-level * x)
      st = { at, level + (at - now) / x, 0 }
      local _, exponent = math.frexp(at)
      slack = 1 + 8 * 2 ^ (exponent - 53)
    end
  else
    if size == 9 + 48 * m then
      own = string.sub(state, 10 + 16 * m)
      for i = 1, m do
        local j = 5 * i
        lim[j - 4], lim[j - 3], lim[j - 2], lim[j - 1] =
          struct.unpack('<dddd', state, 10 + 16 * m + 32 * (i - 1))
      end
    elseif size ~= 9 + 16 * m then
      return redis.error_reply('ERR paced: the key ' .. key .. ' holds ' .. (size - 9) / 16 ..
        ' limits, this limiter has ' .. m .. ', or is not a paced quota; delete it or choose' ..
        ' another name')
    end
    -- The state's doubles: <at> at st[1], limit i's a_i and b_i at st[2 * i] and st[2 * i + 1].
    st = { struct.unpack(LEVELS, state, 2) }
    at = st[1]
    -- A time is a whole number of microseconds (at % 1 is at - floor(at), exact for a finite at).
    if not (at >= 0 and at <= 4 * EXACT and at % 1 == 0) then
      return redis.error_reply('ERR paced: the key ' .. key .. NOT_A_QUOTA)
    end
  end
else
  st = { now }
end
-- The one bucket's interval as read (its own limit's, if any): a new limit keeps a debt in
-- tokens, as the one-bucket form stores it.
local x_read = lim[2]
-- Every bucket's level is now at t0: now, or the latest grant's instant if that is later.
local t0 = now
if at > now then
  t0 = at
end

-- A fixed window (x its length, y its quota, z its phase; a its number and b what it used, as
-- stored) is written out where it is used rather than as functions: a closure made on every
-- call costs Redis more than the arithmetic. Window k starts at k * x + z; the window of t is
-- floor((t - z) / x), or a if that is later (time gone back); what is used in window k >= a is
-- b - (k - a) * y, at least 0.
--
-- The comparisons below keep math.min's and math.max's order of operands (math.max(p, q) is q
-- if q > p, else p), so that every result, a NaN's or a zero's sign included, is theirs.

-- Tokens given back: ARGV[5] before a charge, a settle's negative amounts. back[i] for limit i,
-- charged at back_at (-1: unknown).
local back, back_at
if charging and ARGV[5] and ARGV[5] ~= '' then
  back = { struct.unpack(string.rep('<d', m + 1), ARGV[5]) }
  back_at = back[m + 1]
elseif settling then
  back_at = ARGV[3] and ARGV[3] ~= '' and struct.unpack('<d', ARGV[3]) or -1
end
local given = false
-- Whether this call gives tokens back at all (ARGV[5], or a settle's negative amounts).
local giving = back or settling
-- Whether the latest grant's tokens were given back (the state then moves back in time).
local latest = false

-- A lease, and with the whole-lease rule what each limit's dimension wants beyond the cost
-- and what each limit waits to hold.
local lease_arg = charging and ARGV[4] and ARGV[4] ~= '' and ARGV[4]
local whole = lease_arg and mode == 'reserve' and struct.unpack('<d', lease_arg, 16 * m + 1) == 1
local wants, needs
if whole then
  wants, needs = {}, {}
  for i = 1, m do
    local _, want = struct.unpack('<dd', lease_arg, (i - 1) * 16 + 1)
    wants[i] = want
  end
end

-- The first pass: every limit's level at t0, tokens given back, and for a charge the earliest
-- instant at which every limit has room for its cost (ready), and for its cost and a whole
-- lease (full, with the whole-lease rule; lavish if that is never); never, if a bucket's wait
-- for the cost is 2^64 ns or more. A cost above a bucket's burst is noted (over): never for a
-- "try" or a reservation with a longest wait. If the latest grant was given back, the state
-- moves back in time, and the pass runs again over the levels it found (without giving back).
local ready, full, never, over, lavish = t0, t0, false, false, false
local first = true
while first ~= nil do
  for i = 1, m do
    local j = 5 * i
    local y = lim[j - 2]
    local bucket = lim[j - 4] == 0
    local u, v
    if not first then
      u, v = st[2 * i], st[2 * i + 1]
    elseif state then
      u, v = st[2 * i], st[2 * i + 1]
      if not (u - u == 0 and v - v == 0) then
        return redis.error_reply('ERR paced: the key ' .. key .. NOT_A_QUOTA)
      end
      if bucket then
        if now > at then
          u = u + (now - at) / lim[j - 3]
        end
        if y < u then
          u = y
        end
        if at <= now then
          -- No grant waits: the whole burst may come back.
          v = y
        end
      end
    elseif bucket then
      -- A missing key: every bucket full (its room the whole burst), every window unused.
      u, v = y, y
    else
      u, v = 0, 0
    end
    local g = 0
    if giving and first then
      if back then
        g = back[i]
      elseif lim[j] < 0 then
        g = -lim[j]
      end
    end
    if g > 0 then
      given = true
      if bucket then
        local exact = false
        if at <= now then
          u = u + g
        elseif back_at >= at - slack then
          -- Not capped yet: the state moves back to before the grant first.
          u = u + g
          latest, exact = true, true
        else
          if v < g then
            g = v
          end
          if not (g > 0) then
            g = 0
          end
          u = u + g
          v = v - g
        end
        if y < u and not exact then
          u = y
        end
      else
        -- Only within the window the tokens were charged in, never below 0.
        local x, z = lim[j - 3], lim[j - 1]
        local k = math.floor((back_at - z) / x)
        if math.floor((now - z) / x) == k and u == k then
          v = v - g
          if not (v > 0) then
            v = 0
          end
        end
      end
    end
    st[2 * i], st[2 * i + 1] = u, v
    local c = lim[j]
    if charging and c > 0 and not latest then
      local x = lim[j - 3]
      local n = c
      if whole then
        n = c + wants[i]
        if n > y then
          n = y
        end
        if c > n then
          n = c
        end
        needs[i] = n
      end
      if bucket then
        if c > y then
          over = true
        end
        -- For a cost above the burst: full, then the rest (its debt paid before it passes).
        if u < c then
          local wait = math.ceil((c - u) * x)
          if wait >= NEVER_US then
            never = true
          elseif t0 + wait > ready then
            ready = t0 + wait
          end
        end
        if whole and u < n then
          local wait = math.ceil((n - u) * x)
          if wait >= NEVER_US then
            lavish = true
          elseif t0 + wait > full then
            full = t0 + wait
          end
        end
      else
        -- A window with room for c, or (for a cost above the quota) one with nothing used.
        local z = lim[j - 1]
        local k = math.floor((t0 - z) / x)
        if u > k then
          k = u
        end
        local used = v - (k - u) * y
        if not (used > 0) then
          used = 0
        end
        local room = y - c
        if not (room > 0) then
          room = 0
        end
        if used > room then
          local free = math.ceil((u + math.ceil((v - room) / y)) * x + z)
          if free > ready then
            ready = free
          end
        end
        -- (The same again for the whole lease: a loop sharing the two costs Redis about 850
        -- instructions a limit, more than these lines.)
        if whole then
          room = y - n
          if not (room > 0) then
            room = 0
          end
          if used > room then
            local free = math.ceil((u + math.ceil((v - room) / y)) * x + z)
            if free > full then
              full = free
            end
          end
        end
      end
    end
  end
  first = nil
  if latest then
    -- The latest grant given back: back to the instant at which every bucket held what it
    -- holds at <at> less its refill since (not before now, nor after <at>), and not before
    -- the start of any window whose count the state holds (a window ahead of now counts
    -- grants of its own time only); then the pass again, from there.
    local t1 = now
    for i = 1, m do
      local j = 5 * i
      local z
      if lim[j - 4] == 0 then
        z = at - st[2 * i] * lim[j - 3]
      else
        z = st[2 * i] * lim[j - 3] + lim[j - 1]
      end
      if z > t1 then
        t1 = z
      end
    end
    t1 = math.ceil(t1)
    if t1 > at then
      t1 = at
    end
    for i = 1, m do
      local j = 5 * i
      if lim[j - 4] == 0 then
        local u = st[2 * i] - (at - t1) / lim[j - 3]
        if u > lim[j - 2] then
          u = lim[j - 2]
        end
        st[2 * i] = u
      end
    end
    at = t1
    t0 = now
    if at > now then
      t0 = at
    end
    ready, full, never, over, lavish = t0, t0, false, false, false
    latest, first = false, false
  end
end

-- Gives limit i the parameters x2, y2, z2 of its kind at t0, keeping its level: a bucket's
-- tokens (at most the new burst; in the one-bucket form a full bucket stays full, as a missing
-- key starts full, where the general form keeps the tokens as a local limiter does), a
-- window's use of the window in force (carried into the new window's count). Made only for
-- "limit" and "clear": a grant makes no closure.
local apply_limit
if mode == 'limit' or mode == 'clear' then
  apply_limit = function(i, x2, y2, z2)
    local j = 5 * i
    if lim[j - 4] == 0 then
      if (compact and st[2 * i] >= lim[j - 2]) or y2 < st[2 * i] then
        st[2 * i] = y2
      end
      lim[j - 3], lim[j - 2] = x2, y2
    else
      local x, y, a, b = lim[j - 3], lim[j - 2], st[2 * i], st[2 * i + 1]
      local k = math.floor((t0 - lim[j - 1]) / x)
      if a > k then
        k = a
      end
      local used = b - (k - a) * y
      if not (used > 0) then
        used = 0
      end
      lim[j - 3], lim[j - 2], lim[j - 1] = x2, y2, z2
      st[2 * i], st[2 * i + 1] = math.floor((t0 - z2) / x2), used
    end
  end
end

-- What this call stores: its instant (the state's new <at>) and its answer; charge: whether
-- the last pass charges the amounts.
local t, reply, charge = t0, nil, false
if mode == 'limit' then
  local i, k2, x2, y2, z2 = struct.unpack('<ddddd', ARGV[3])
  if i < 1 or i > m or i ~= math.floor(i) then
    return redis.error_reply('ERR paced: no limit ' .. i .. ' in ' .. key)
  end
  if k2 ~= lim[5 * i - 4] then
    return redis.error_reply('ERR paced: limit ' .. i .. ' of ' .. key .. ' is of the other kind')
  end
  apply_limit(i, x2, y2, z2)
  own = ''
  for l = 1, m do
    local j = 5 * l
    if compact then
      own = own .. struct.pack('<dd', lim[j - 3], lim[j - 2])
    else
      own = own .. struct.pack('<dddd', lim[j - 4], lim[j - 3], lim[j - 2], lim[j - 1])
    end
  end
  reply = { 1, 0, t0 }
elseif mode == 'clear' then
  if not state then
    return { 1, 0, t0 }
  end
  for i = 1, m do
    if struct.unpack('<d', spec, 40 * i - 39) ~= lim[5 * i - 4] then
      return redis.error_reply('ERR paced: limit ' .. i .. ' of ' .. key .. ' is of the other kind')
    end
  end
  for i = 1, m do
    local _, x2, y2, z2 = struct.unpack('<dddd', spec, 40 * i - 39)
    apply_limit(i, x2, y2, z2)
  end
  own = ''
  reply = { 1, 0, t0 }
elseif settling then
  charge = true
  reply = { 1, 0, t0 }
else
  -- A "try", or a reservation with a longest wait (`acquire_timeout`), can never have a cost
  -- above a bucket's burst without waiting: never. (A reservation without one waits for the
  -- bucket to fill and the rest to flow in.)
  local max_wait = mode == 'reserve' and ARGV[3] and ARGV[3] ~= '' and struct.unpack('<d', ARGV[3])
  local timed = mode == 'try' or (max_wait and max_wait < NEVER_US)
  if whole then
    if lavish or (max_wait and full - now > max_wait) then
      -- The whole lease is never, or later than the longest wait: the cost alone.
      lease_arg = nil
    else
      ready = full
    end
  end
  local wait = ready - now
  if ready > EXACT then
    -- Beyond 2^53 us (285 years of debt) a double holds even microseconds only: rounded up.
    ready = ready + 2
    wait = ready - now
  end
  if never or (over and timed) or wait >= NEVER_US then
    reply = { 0, NEVER_US, 0 }
  elseif (mode == 'try' and wait > 0) or (max_wait and wait > max_wait) then
    reply = { 0, wait, 0 }
  else
    charge = true
    t = ready
    reply = { 1, wait, ready }
    -- A lease: per dimension, the least room beyond the cost of any of its limits at the
    -- grant's instant, whole tokens, at most the most asked for; each limit's amount, then the
    -- reply, carries its dimension's.
    if lease_arg then
      local dim, extra, wanted = {}, {}, {}
      for i = 1, m do
        local j = 5 * i
        local d, want = struct.unpack('<dd', lease_arg, (i - 1) * 16 + 1)
        local c, x, y, a, b = lim[j], lim[j - 3], lim[j - 2], st[2 * i], st[2 * i + 1]
        local room
        if lim[j - 4] == 0 then
          local l = a
          if ready > t0 then
            l = math.min(y, l + (ready - t0) / x)
          end
          -- Waited for: held, whatever the rounding of the refill.
          if whole and ready == full and needs[i] and needs[i] > l then
            l = needs[i]
          end
          if c > y then
            l = 0
          end
          room = l - c
        else
          local k = math.max(math.floor((ready - lim[j - 1]) / x), a)
          room = y - math.max(0, b - (k - a) * y) - c
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
      for i = 1, m do
        local n = extra[dim[i]] or 0
        reply[3 + i] = n
        lim[5 * i] = lim[5 * i] + n
      end
    end
  end
end

if not charge and not given and not apply_limit then
  -- A refusal that gave nothing back writes nothing.
  return reply
end

-- The last pass: every limit charged at the grant's instant, or settled; then the state is
-- stored at t, to expire when every bucket would be full again and every carry is spent
-- (unless it keeps limits of its own).
local until_us = t
local empty = t <= now
for i = 1, m do
  local j = 5 * i
  local c, x, y = lim[j], lim[j - 3], lim[j - 2]
  local a, b = st[2 * i], st[2 * i + 1]
  if lim[j - 4] == 0 then
    if t > t0 then
      local refill = a + (t - t0) / x
      if refill < y then
        a = refill
      else
        a = y
      end
    end
    if charge and c > 0 then
      if t > now then
        -- A grant that waits: tokens given back before its instant must leave room for it.
        if y - a < b then
          b = y - a
        end
      end
      if settling then
        a = a - c
      elseif c > y then
        -- It waited for the whole of it to flow in: it leaves an empty bucket.
        a = 0
      else
        a = a - c
      end
    end
    local refilled = t + (y - a) * x
    if refilled > until_us then
      until_us = refilled
    end
    if a < y then
      empty = false
    end
  else
    local z = lim[j - 1]
    if charge and c > 0 then
      -- Charged in the window of t (the grant's instant; for a settle, t0), with what that
      -- window already used.
      local k = math.floor((t - z) / x)
      if a > k then
        k = a
      end
      local used = b - (k - a) * y
      if not (used > 0) then
        used = 0
      end
      a, b = k, used + c
    end
    if b > 0 then
      empty = false
      local spent = (a + math.ceil(b / y)) * x + z
      if spent > until_us then
        until_us = spent
      end
    end
  end
  st[2 * i], st[2 * i + 1] = a, b
end
if empty and own == '' then
  -- Every bucket full, every window unused, no limits of its own: the same as no key.
  if state then
    redis.call('DEL', key)
  end
  return reply
end
local value
if compact then
  -- The level at now: what the bucket holds at t, less its refill until then (a debt while
  -- grants wait), at the rate it was read with: a new limit keeps a debt in tokens.
  local level = st[2]
  if t > now then
    level = level - (t - now) / x_read
  end
  value = struct.pack('<Bdd', VERSION, level, now)
else
  st[1] = t
  value = struct.pack(STATE, VERSION, unpack(st, 1, 2 * m + 1))
end
local ttl_ms = math.ceil((until_us - now) / 1000) + 1
if own ~= '' then
  redis.call('SET', key, value .. own)
elseif ttl_ms < EXACT then
  redis.call('SET', key, value, 'PX', string.format('%d', ttl_ms))
else
  redis.call('SET', key, value)
end
return reply
