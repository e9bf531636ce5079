"""objdebug/pipeline."""
