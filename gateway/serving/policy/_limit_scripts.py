"""Lua scripts of the cluster-wide tenant limits: each admission is one atomic script.

Key layout under prefix P, per tenant T (every key expires after its window
or lease, so idle tenants leave nothing behind):
  P:lim:T:req     ZSET  admission id -> time            (requests in the window)
  P:lim:T:tok     ZSET  "id:tokens" -> time             (tokens in the window)
  P:lim:T:toksum  STR   sum of the tokens in P:lim:T:tok
  P:lim:T:conc    ZSET  admission id -> lease expiry    (requests in flight)
Times are the Redis server's clock (TIME), so replicas need not agree on
theirs. The arithmetic is `gateway.serving.policy.windows.SlidingWindowLog`'s:
at most N in any window; when refused, the wait is until enough of the
oldest entries have left the window. In-flight entries are leases renewed by
their replica; a replica that dies leaves entries that lapse after the lease.
"""

from __future__ import annotations

# ARGV: p, tenant, id, window_s, rpm|'', tpm|'', tokens, conc|'', lease_s
# Returns {'ok', now} or {code, wait_s}; codes as in limits.refusal.
ADMIT = """
local p, tenant, id = ARGV[1], ARGV[2], ARGV[3]
local window, rpm, tpm, tokens = tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7])
local conc, lease = ARGV[8], tonumber(ARGV[9])
local tm = redis.call('TIME')
local now = tonumber(tm[1]) + tonumber(tm[2]) / 1000000
local base = p..':lim:'..tenant
local rk, tk, sk, ck = base..':req', base..':tok', base..':toksum', base..':conc'
local keep = math.floor(window * 1000) + 1000
redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
if conc ~= '' and redis.call('ZCARD', ck) >= tonumber(conc) then
  return {'concurrency_limit_exceeded', '1'}
end
if rpm ~= '' then
  redis.call('ZREMRANGEBYSCORE', rk, '-inf', now - window)
  local n, lim = redis.call('ZCARD', rk), tonumber(rpm)
  if n + 1 > lim then
    local leaving = redis.call('ZRANGE', rk, n - lim, n - lim, 'WITHSCORES')
    return {'requests_per_minute_exceeded', tostring(tonumber(leaving[2]) + window - now)}
  end
end
if tpm ~= '' then
  local lim = tonumber(tpm)
  if tokens > lim then return {'request_too_large', tostring(window)} end
  local old = redis.call('ZRANGEBYSCORE', tk, '-inf', now - window)
  if #old > 0 then
    local freed = 0
    for _, m in ipairs(old) do freed = freed + tonumber(string.match(m, ':(%d+)$')) end
    redis.call('ZREMRANGEBYSCORE', tk, '-inf', now - window)
    redis.call('DECRBY', sk, freed)
  end
  local used = tonumber(redis.call('GET', sk) or '0')
  if used + tokens > lim then
    local excess, freed = used + tokens - lim, 0
    local entries = redis.call('ZRANGE', tk, 0, -1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      freed = freed + tonumber(string.match(entries[i], ':(%d+)$'))
      if freed >= excess then
        return {'tokens_per_minute_exceeded', tostring(tonumber(entries[i + 1]) + window - now)}
      end
    end
    return {'tokens_per_minute_exceeded', tostring(window)}
  end
end
if rpm ~= '' then
  redis.call('ZADD', rk, now, id)
  redis.call('PEXPIRE', rk, keep)
end
if tpm ~= '' then
  redis.call('ZADD', tk, now, id..':'..tokens)
  redis.call('INCRBY', sk, tokens)
  redis.call('PEXPIRE', tk, keep)
  redis.call('PEXPIRE', sk, keep)
end
redis.call('ZADD', ck, now + lease, id)
redis.call('PEXPIRE', ck, math.floor(lease * 1000) + 1000)
return {'ok', tostring(now)}
"""

# ARGV: p, tenant, id  -- the request ended
RELEASE = """
redis.call('ZREM', ARGV[1]..':lim:'..ARGV[2]..':conc', ARGV[3])
return 0
"""

# ARGV: p, tenant, id, tokens  -- the request never ran: out of the windows too
CANCEL = """
local base = ARGV[1]..':lim:'..ARGV[2]
redis.call('ZREM', base..':req', ARGV[3])
if redis.call('ZREM', base..':tok', ARGV[3]..':'..ARGV[4]) == 1 then
  redis.call('DECRBY', base..':toksum', tonumber(ARGV[4]))
end
redis.call('ZREM', base..':conc', ARGV[3])
return 0
"""

# ARGV: p, lease_s, then tenant, id pairs  -- extend the leases of requests still running
RENEW = """
local tm = redis.call('TIME')
local until_ = tonumber(tm[1]) + tonumber(tm[2]) / 1000000 + tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  local ck = ARGV[1]..':lim:'..ARGV[i]..':conc'
  redis.call('ZADD', ck, 'XX', until_, ARGV[i + 1])
  redis.call('PEXPIRE', ck, math.floor(tonumber(ARGV[2]) * 1000) + 1000)
end
return 0
"""

# ARGV: p, window_s, then tenant, id, t, tokens|'' quads  -- admissions made locally
# while Redis was unreachable, so the window after it comes back counts them.
REPLAY = """
local p, window = ARGV[1], tonumber(ARGV[2])
local keep = math.floor(window * 1000) + 1000
for i = 3, #ARGV, 4 do
  local base = p..':lim:'..ARGV[i]
  local id, t, tokens = ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  redis.call('ZADD', base..':req', 'NX', t, id)
  redis.call('PEXPIRE', base..':req', keep)
  if tokens ~= '' and redis.call('ZADD', base..':tok', 'NX', t, id..':'..tokens) == 1 then
    redis.call('INCRBY', base..':toksum', tonumber(tokens))
    redis.call('PEXPIRE', base..':tok', keep)
    redis.call('PEXPIRE', base..':toksum', keep)
  end
end
return 0
"""
