"""The node daemon: a thin asyncio shell that feeds socket events and the clock to the
sans-I/O scheduler core and carries out what it decides."""
