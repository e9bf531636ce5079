"""objdebug/core."""
