"""Lua scripts of the Redis directory: each mutation is one atomic script.

Key layout under prefix P (default "{kvpool}", a hash tag so a Redis Cluster
puts every key in one slot; scripts build key names from P):
  P:loc:<hash>      HASH  node -> slot
  P:held:<node>     ZSET  hash -> last access time
  P:nodes           HASH  node -> block_bytes
  P:nblocks         STR   distinct hashes held by at least one node
  P:refs            HASH  hash -> active branches referencing it
  P:trefs:<tenant>  HASH  hash -> active branches of that tenant referencing it
  P:br:<id>         HASH  tenant, parent, session, opened, last
  P:tbr:<tenant>    SET   that tenant's active branches
  P:brb:<id>        SET   hashes the branch references
  P:active          ZSET  branch -> last active time
  P:size            ZSET  branch -> distinct blocks referenced
  P:stats           HASH  lookups, looked_up_blocks, hit_blocks
Times are stored with Python's repr(float) and compared as Lua numbers.
"""

from __future__ import annotations

PUBLISH = """
local p, node, bb, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
redis.call('HSET', p..':nodes', node, bb)
for i = 5, #ARGV, 2 do
  local h, slot = ARGV[i], ARGV[i + 1]
  local k = p..':loc:'..h
  if redis.call('HLEN', k) == 0 then redis.call('INCR', p..':nblocks') end
  redis.call('HSET', k, node, slot)
  redis.call('ZADD', p..':held:'..node, now, h)
end
return 0
"""

UNPUBLISH = """
local p, node = ARGV[1], ARGV[2]
for i = 3, #ARGV do
  local h = ARGV[i]
  local k = p..':loc:'..h
  if redis.call('HDEL', k, node) == 1 and redis.call('HLEN', k) == 0 then
    redis.call('DECR', p..':nblocks')
  end
  redis.call('ZREM', p..':held:'..node, h)
end
return 0
"""

DROP_NODE = """
local p, node = ARGV[1], ARGV[2]
local held = redis.call('ZRANGE', p..':held:'..node, 0, -1)
for _, h in ipairs(held) do
  local k = p..':loc:'..h
  if redis.call('HDEL', k, node) == 1 and redis.call('HLEN', k) == 0 then
    redis.call('DECR', p..':nblocks')
  end
end
redis.call('DEL', p..':held:'..node)
redis.call('HDEL', p..':nodes', node)
return held
"""

TOUCH_BLOCKS = """
local p, node, now = ARGV[1], ARGV[2], ARGV[3]
for i = 4, #ARGV do
  redis.call('ZADD', p..':held:'..node, 'XX', now, ARGV[i])
end
return 0
"""

# Returns -1 when the branch is not active, else 0.
_TOUCH_BODY = """
local k = p..':br:'..id
if redis.call('EXISTS', k) == 0 then return -1 end
if tonumber(now) > tonumber(redis.call('HGET', k, 'last')) then
  redis.call('HSET', k, 'last', now)
  redis.call('ZADD', p..':active', now, id)
end
"""

# ARGV[7]: the tenant's max active branches ('' = no cap). Returns -2 (and
# opens nothing) for a new branch past the cap, else the branch as read
# right after (its fields as HGETALL's flat list, then 'size' and its
# score): one round trip, and no replica can finish it in between.
OPEN_BRANCH = (
    """
local p, id, tenant, now, parent, session, cap = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local k = p..':br:'..id
if redis.call('EXISTS', k) == 0 then
  if cap ~= '' and redis.call('SCARD', p..':tbr:'..tenant) >= tonumber(cap) then return -2 end
  redis.call('HSET', k, 'tenant', tenant, 'parent', parent, 'session', session,
             'opened', now, 'last', now)
  redis.call('ZADD', p..':active', now, id)
  redis.call('ZADD', p..':size', 0, id)
  redis.call('SADD', p..':tbr:'..tenant, id)
else
"""
    + _TOUCH_BODY
    + """
end
local f = redis.call('HGETALL', k)
f[#f + 1] = 'size'
f[#f + 1] = redis.call('ZSCORE', p..':size', id) or '0'
return f
"""
)

TOUCH = (
    """
local p, id, now = ARGV[1], ARGV[2], ARGV[3]
"""
    + _TOUCH_BODY
    + """
return 0
"""
)

REFERENCE = (
    """
local p, id, now = ARGV[1], ARGV[2], ARGV[3]
"""
    + _TOUCH_BODY
    + """
local tenant = redis.call('HGET', k, 'tenant')
local added = 0
for i = 4, #ARGV do
  local h = ARGV[i]
  if redis.call('SADD', p..':brb:'..id, h) == 1 then
    redis.call('HINCRBY', p..':refs', h, 1)
    redis.call('HINCRBY', p..':trefs:'..tenant, h, 1)
    added = added + 1
  end
end
if added > 0 then redis.call('ZINCRBY', p..':size', added, id) end
return added
"""
)

# ARGV: p, id, cutoff ('' = finish unconditionally; else expire only if
# last <= cutoff, so a touch from another replica wins the race).
# Returns false when nothing was released, else the branch HASH as a flat list.
RELEASE = """
local p, id, cutoff = ARGV[1], ARGV[2], ARGV[3]
local k = p..':br:'..id
if redis.call('EXISTS', k) == 0 then return false end
if cutoff ~= '' and tonumber(redis.call('HGET', k, 'last')) > tonumber(cutoff) then
  return false
end
local info = redis.call('HGETALL', k)
local tenant = redis.call('HGET', k, 'tenant')
local tk = p..':trefs:'..tenant
local members = redis.call('SMEMBERS', p..':brb:'..id)
for _, h in ipairs(members) do
  if redis.call('HINCRBY', p..':refs', h, -1) <= 0 then redis.call('HDEL', p..':refs', h) end
  if redis.call('HINCRBY', tk, h, -1) <= 0 then redis.call('HDEL', tk, h) end
end
redis.call('DEL', k, p..':brb:'..id)
redis.call('SREM', p..':tbr:'..tenant, id)
redis.call('ZREM', p..':active', id)
redis.call('ZREM', p..':size', id)
table.insert(info, 'size')
table.insert(info, tostring(#members))
return info
"""
