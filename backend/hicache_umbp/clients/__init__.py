"""mori's UMBP clients: the factories that open them, the guards around them (one SSD batch at a
time, reconnect to a restarted sidecar) and the standalone registration reaper. mori itself is
imported lazily, inside the factories."""
