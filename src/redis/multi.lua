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
-- Cost. This runs on every request: one TIME, one GET, at most one write (a refusal writes
-- nothing); ARGV[2] and the state each read by one struct.unpack into one table, the state
-- written by one struct.pack; a pass over the limits to read them (and find when a charge can be
-- granted), another to charge them and find when the key may expire; no closures. A table read
-- costs Redis more than the arithmetic around it, so each pass reads a limit's numbers once.
--
-- Returns { granted, wait_us, at }: granted = 1, usable after wait_us (0: at once), charged at
-- Redis time <at> (a "try" with a lease: then what each limit's dimension took beyond the
-- cost, one number per limit); granted = 0, refused, taking nothing, grantable in wait_us. wait_us =
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
local m = #spec / 40
-- The formats of ARGV[2], of the state's doubles (<at>, then two per limit) and of the state
-- (its version byte, then those), spelled out for one and two limits: building a string costs
-- Redis more than the comparisons.
local SPEC, LEVELS, STATE
if m == 1 then
  SPEC, LEVELS, STATE = '<ddddd', '<ddd', '<Bddd'
elseif m == 2 then
  SPEC, LEVELS, STATE = '<dddddddddd', '<ddddd', '<Bddddd'
else
  SPEC, LEVELS = string.rep('<ddddd', m), string.rep('<d', 2 * m + 1)
  STATE = '<B' .. LEVELS
end
-- ARGV[2]'s limits in one table: limit i's kind, x, y, z and amount at lim[5 * i - 4 .. 5 * i].
-- A state with limits of its own overrides kind, x, y, z ("clear" reads ARGV[2] again).
local lim = { struct.unpack(SPEC, spec) }
local st
-- The limits kept in the state (all of them, packed as stored), or '' for none.
local own = ''
-- "reserve" and "try" charge every limit (as does any other mode); "settle" corrects them.
local charging = mode ~= 'limit' and mode ~= 'clear' and mode ~= 'settle'
local settling = mode == 'settle'

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
  if #state == 9 + 48 * m then
    own = string.sub(state, 10 + 16 * m)
    for i = 1, m do
      local j = 5 * i
      lim[j - 4], lim[j - 3], lim[j - 2], lim[j - 1] =
        struct.unpack('<dddd', state, 10 + 16 * m + 32 * (i - 1))
    end
  elseif #state ~= 9 + 16 * m then
    return redis.error_reply('ERR paced: the key ' .. key .. ' holds ' .. (#state - 9) / 16 ..
      ' limits, this limiter has ' .. m .. ', or is not a paced quota; delete it or choose' ..
      ' another name')
  end
  -- The state's doubles: <at> at st[1], limit i's a_i and b_i at st[2 * i] and st[2 * i + 1].
  st = { struct.unpack(LEVELS, state, 2) }
  at = st[1]
  -- A time is a whole number of microseconds (at % 1 is at - floor(at), exact for a finite at).
  if not (at >= 0 and at <= EXACT and at % 1 == 0) then
    return redis.error_reply('ERR paced: the key ' .. key .. NOT_A_QUOTA)
  end
else
  st = { now }
end
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

-- The first pass: every limit's level at t0 and, for a charge, the earliest instant at which
-- every limit has room (the latest of the limits' own; never, if a bucket's wait is 2^64 ns or
-- more). A cost above a bucket's burst is noted: never for a "try" or a reservation with a
-- longest wait. The refusals wait until every limit of the state has been read: a state that
-- is not a paced quota is answered as such first.
local ready, never, over = t0, false, false
for i = 1, m do
  local j = 5 * i
  local y = lim[j - 2]
  local bucket = lim[j - 4] == 0
  local u, v
  if state then
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
      st[2 * i], st[2 * i + 1] = u, v
    end
  elseif bucket then
    -- A missing key: every bucket full (its room the whole burst), every window unused.
    u, v = y, y
    st[2 * i], st[2 * i + 1] = y, y
  else
    u, v = 0, 0
    st[2 * i], st[2 * i + 1] = 0, 0
  end
  local c = lim[j]
  if charging and c > 0 then
    if bucket then
      if c > y then
        over = true
      end
      if u < c then
        -- For a cost above the burst: full, then the rest (its debt paid before it passes).
        local wait = math.ceil((c - u) * lim[j - 3])
        if wait >= NEVER_US then
          never = true
        elseif t0 + wait > ready then
          ready = t0 + wait
        end
      end
    else
      -- A window with room for c, or (for a cost above the quota) one with nothing used.
      local x, z = lim[j - 3], lim[j - 1]
      local room = y - c
      if not (room > 0) then
        room = 0
      end
      local k = math.floor((t0 - z) / x)
      if u > k then
        k = u
      end
      local used = v - (k - u) * y
      if not (used > 0) then
        used = 0
      end
      if used > room then
        local n = math.ceil((v - room) / y)
        local free = math.ceil((u + n) * x + z)
        if free > ready then
          ready = free
        end
      end
    end
  end
end

-- Gives limit i the parameters x2, y2, z2 of its kind at t0, keeping its level: a bucket's
-- tokens (at most the new burst), a window's use of the window in force (carried into the new
-- window's count). Made only for "limit" and "clear": a grant makes no closure.
local apply_limit
if not charging and not settling then
  apply_limit = function(i, x2, y2, z2)
    local j = 5 * i
    if lim[j - 4] == 0 then
      if y2 < st[2 * i] then
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

-- What this call stores: its instant (the state's new <at>) and its answer.
local t, reply
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
    own = own .. struct.pack('<dddd', lim[j - 4], lim[j - 3], lim[j - 2], lim[j - 1])
  end
  t, reply = t0, { 1, 0, t0 }
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
  t, reply = t0, { 1, 0, t0 }
elseif settling then
  t, reply = t0, { 1, 0, t0 }
else
  -- A "try", or a reservation with a longest wait (`acquire_timeout`), can never have a cost
  -- above a bucket's burst without waiting: never. (A reservation without one waits for the
  -- bucket to fill and the rest to flow in.)
  local max_wait = mode == 'reserve' and ARGV[3] and struct.unpack('<d', ARGV[3])
  local timed = mode == 'try' or (max_wait and max_wait < NEVER_US)
  if never or (over and timed) then
    return { 0, NEVER_US, 0 }
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
  reply = { 1, wait, ready }
  -- A lease: per dimension, the least room beyond the cost of any of its limits at the grant's
  -- instant, whole tokens, at most the most asked for; each limit's amount, then the reply,
  -- carries its dimension's.
  local lease_arg = (mode == 'try' and ARGV[3]) or (mode == 'reserve' and ARGV[4])
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
  t = ready
end

-- The last pass: every limit charged at the grant's instant, or settled; then the state is
-- stored at t, to expire when every bucket would be full again and every carry is spent
-- (unless it keeps limits of its own).
local charged_at = settling and (ARGV[3] and struct.unpack('<d', ARGV[3]) or t0)
local until_us = t
for i = 1, m do
  local j = 5 * i
  local c, x, y = lim[j], lim[j - 3], lim[j - 2]
  local a, b = st[2 * i], st[2 * i + 1]
  if lim[j - 4] == 0 then
    if charging then
      if t > t0 then
        local full = a + (t - t0) / x
        if full < y then
          a = full
        else
          a = y
        end
      end
      if t > now and c > 0 then
        -- A grant that waits: tokens given back before its instant must leave room for it.
        if y - a < b then
          b = y - a
        end
      end
      if c > y then
        -- It waited for the whole of it to flow in: it leaves an empty bucket.
        a = 0
      else
        a = a - c
      end
    elseif settling then
      -- A refund is capped at the burst and at the room (see "Tokens given back while grants
      -- wait"); a charge may leave a debt.
      if c < 0 then
        local back = -c
        if b < back then
          back = b
        end
        if not (back > 0) then
          back = 0
        end
        local full = a + back
        if full < y then
          a = full
        else
          a = y
        end
        b = b - back
      elseif c > 0 then
        a = a - c
      end
    end
    local full = t + (y - a) * x
    if full > until_us then
      until_us = full
    end
  else
    local z = lim[j - 1]
    if c > 0 and (charging or settling) then
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
    elseif c < 0 and settling then
      -- Given back only within the window the grant was charged in, never below 0.
      local k = math.floor((charged_at - z) / x)
      if math.floor((now - z) / x) == k and a == k then
        b = b + c
        if not (b > 0) then
          b = 0
        end
      end
    end
    if b > 0 then
      local spent = (a + math.ceil(b / y)) * x + z
      if spent > until_us then
        until_us = spent
      end
    end
  end
  st[2 * i], st[2 * i + 1] = a, b
end
st[1] = t
local value = struct.pack(STATE, VERSION, unpack(st, 1, 2 * m + 1))
local ttl_ms = math.ceil((until_us - now) / 1000) + 1
if own ~= '' then
  redis.call('SET', key, value .. own)
elseif ttl_ms < EXACT then
  redis.call('SET', key, value, 'PX', string.format('%d', ttl_ms))
else
  redis.call('SET', key, value)
end
return reply
