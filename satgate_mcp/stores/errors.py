"""What a store that cannot answer raises, named once so callers need not import a backend to catch it."""

from __future__ import annotations

import sqlite3

from redis.exceptions import RedisError

#: Redis down, paused past SATGATE_REDIS_TIMEOUT, or the state database locked, unwritable or corrupt.
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError, sqlite3.Error)
