"""Whether an image may be used: containers-policy.json(5) and containers-registries.d(5),
as containers/image (the library CRI-O and Podman use) reads them.

Pure parts (parsing the files, choosing a scope, matching signed identities, reading
signature payloads) are tested without a daemon; the parts that verify cryptography,
fetch signatures and remember them are thin layers on top. The puller asks
``enforcer.SignaturePolicy`` after a manifest is resolved and before any layer is
fetched, and CreateContainer asks it again with the pod namespace's policy.
"""
