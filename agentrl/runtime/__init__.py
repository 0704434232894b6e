"""Process plumbing: CPU pinning, the ``async with`` lifecycle, the cleanup watchdog,
blocking calls awaited on daemon threads."""
