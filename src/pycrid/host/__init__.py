"""The host under every part: mount(2), cgroups, pinned namespaces and the facts probed
once at start."""
