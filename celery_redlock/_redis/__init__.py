"""The Redis layer: key names, owner tokens, Lua scripts, clients, nodes, renewal and the lock.

Nothing here imports Celery (a test pins it), so :class:`celery_redlock.Lock` works in any
process.
"""
